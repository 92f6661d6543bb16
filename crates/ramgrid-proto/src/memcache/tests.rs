//! Unit tests of the memcached request parser: every command, every error path. The expected
//! reply strings are the ones memcached 1.6.18 sends for the same input.

use std::borrow::Cow;

use super::*;

fn p(input: &[u8]) -> Result<(Request<'_>, usize), ParseError> {
    parse_request(input, &Limits::default())
}

fn req(input: &[u8]) -> Request<'_> {
    match p(input) {
        Ok((r, n)) => {
            assert_eq!(
                n,
                input.len(),
                "consumed all of {:?}",
                String::from_utf8_lossy(input)
            );
            r
        }
        Err(e) => panic!("{:?} -> {e:?}", String::from_utf8_lossy(input)),
    }
}

fn rec(consumed: usize, reply: &str) -> Result<(Request<'static>, usize), ParseError> {
    Err(ParseError::Recoverable {
        consumed,
        reply: Cow::Owned(reply.to_string()),
    })
}

/// The input is one bad line; the error consumes exactly it and replies `reply`.
fn bad_line(input: &[u8], reply: &str) {
    assert_eq!(
        p(input),
        rec(input.len(), reply),
        "{:?}",
        String::from_utf8_lossy(input)
    );
}

fn fatal(input: &[u8]) -> &'static str {
    match p(input) {
        Err(ParseError::Fatal { reply, reason }) => {
            assert_eq!(reply, "");
            reason
        }
        other => panic!("{:?} -> {other:?}", String::from_utf8_lossy(input)),
    }
}

const FORMAT: &str = "CLIENT_ERROR bad command line format\r\n";

fn keys(r: &Request<'_>) -> Vec<Vec<u8>> {
    match r {
        Request::Get { keys, .. } | Request::Gat { keys, .. } => {
            keys.iter().map(<[u8]>::to_vec).collect()
        }
        other => panic!("not a get: {other:?}"),
    }
}

fn meta<'a>(r: &Request<'a>) -> Meta<'a> {
    match r {
        Request::MetaGet(m) | Request::MetaDelete(m) | Request::MetaArith(m) => *m,
        Request::MetaSet { meta, .. } => *meta,
        other => panic!("not meta: {other:?}"),
    }
}

// --- framing ------------------------------------------------------------------------------------

#[test]
fn empty_and_partial_input_is_incomplete() {
    for input in [
        &b""[..],
        b"g",
        b"get",
        b"get a",
        b"get a\r",
        b"set k 0 0 1\r\n",
        b"set k 0 0 1\r\nx",
        b"set k 0 0 1\r\nx\r",
    ] {
        assert_eq!(
            p(input),
            Err(ParseError::Incomplete),
            "{:?}",
            String::from_utf8_lossy(input)
        );
    }
}

#[test]
fn lines_end_with_crlf_or_bare_lf() {
    assert_eq!(req(b"version\r\n"), Request::Version);
    assert_eq!(req(b"version\n"), Request::Version);
    assert_eq!(req(b"  version   \r\n"), Request::Version);
    let r = req(b"set k 0 0 1\nx\r\n");
    assert!(matches!(r, Request::Store(Store { data: b"x", .. })));
}

#[test]
fn pipelined_requests_are_taken_one_at_a_time() {
    let buf = b"set a 1 2 3\r\nabc\r\nget a b\r\nmn\r\ndelete a noreply\r\n";
    let (r1, n1) = p(buf).unwrap();
    assert_eq!(n1, 18);
    assert!(matches!(
        r1,
        Request::Store(Store {
            key: b"a",
            flags: 1,
            exptime: 2,
            data: b"abc",
            ..
        })
    ));
    let (r2, n2) = p(&buf[n1..]).unwrap();
    assert_eq!(keys(&r2), vec![b"a".to_vec(), b"b".to_vec()]);
    let (r3, n3) = p(&buf[n1 + n2..]).unwrap();
    assert_eq!(r3, Request::MetaNoop);
    let (r4, n4) = p(&buf[n1 + n2 + n3..]).unwrap();
    assert_eq!(
        r4,
        Request::Delete {
            key: b"a",
            noreply: true
        }
    );
    assert_eq!(n1 + n2 + n3 + n4, buf.len());
}

#[test]
fn empty_and_short_commands_are_errors() {
    bad_line(b"\r\n", "ERROR\r\n");
    bad_line(b"\n", "ERROR\r\n");
    bad_line(b"   \r\n", "ERROR\r\n");
    bad_line(b"x\r\n", "ERROR\r\n");
    bad_line(b"g a\r\n", "ERROR\r\n");
    bad_line(b"xy\r\n", "ERROR\r\n");
    bad_line(b"VERSION\r\n", "ERROR\r\n");
    bad_line(b"sets a\r\n", "ERROR\r\n");
    bad_line(b"mz a\r\n", "ERROR\r\n");
    bad_line(b"mget a\r\n", "ERROR\r\n");
}

#[test]
fn shutdown_is_refused_like_a_memcached_without_it() {
    bad_line(b"shutdown\r\n", "ERROR: shutdown not enabled\r\n");
    bad_line(b"shutdown graceful\r\n", "ERROR: shutdown not enabled\r\n");
}

#[test]
fn http_request_lines_close_the_connection() {
    assert_eq!(fatal(b"GET / HTTP/1.0\r\n"), "HTTP request");
    assert_eq!(fatal(b"POST /x HTTP/1.1\r\nHost: a\r\n"), "HTTP request");
    assert_eq!(fatal(b"HTTP/1.1\r\n"), "HTTP request");
    // Under a known first letter memcached answers ERROR instead, and so do we.
    bad_line(b"gET / HTTP/1.0\r\n", "ERROR\r\n");
    bad_line(b"mx / HTTP/1.1\r\n", "ERROR\r\n");
    // A real get of those keys is a get.
    assert_eq!(keys(&req(b"get / HTTP/1.0\r\n")).len(), 2);
}

#[test]
fn binary_garbage_closes_the_connection() {
    assert_eq!(
        fatal(b"\x80\x01\x00\x00"),
        "binary protocol or non-text first byte"
    );
    assert_eq!(fatal(b"\xff"), "binary protocol or non-text first byte");
    // A tab is part of a token, as in memcached: `a\tb` is a key, not a reason to close.
    assert_eq!(keys(&req(b"get a\tb\r\n")), vec![b"a\tb".to_vec()]);
    // So is every other byte but NUL, '\n' and space (memcached 1.6.18 stores such keys); a line
    // is only ever complete at its '\n'.
    assert_eq!(p(b"get a\x01"), Err(ParseError::Incomplete));
    assert_eq!(p(b"get a\rb"), Err(ParseError::Incomplete));
    assert_eq!(p(b"get a\r"), Err(ParseError::Incomplete));
    assert_eq!(keys(&req(b"get a\rb\r\n")), vec![b"a\rb".to_vec()]);
    // One CR before the LF is dropped, a second one belongs to the key.
    assert_eq!(keys(&req(b"get a\r\r\n")), vec![b"a\r".to_vec()]);
    bad_line(b"version\r\r\n", "ERROR\r\n");
    // Bytes >= 0x80 inside a line are fine (UTF-8 keys).
    assert_eq!(
        keys(&req("get ключ\r\n".as_bytes())),
        vec!["ключ".as_bytes().to_vec()]
    );
    // Data blocks are binary-safe.
    assert!(matches!(
        req(b"set k 0 0 3\r\n\x00\r\n\r\n"),
        Request::Store(Store {
            data: b"\x00\r\n",
            ..
        })
    ));
}

/// memcached 1.6.18's key rule, measured byte by byte (tests/conformance/keys.txt): a key is 1 to
/// 250 bytes of anything but NUL, '\n' and space; a NUL ends the command line.
#[test]
fn keys_hold_every_byte_but_nul_newline_and_space() {
    for b in (1..=255u8).filter(|&b| b != b'\n' && b != b' ') {
        let key = [b'k', b, b'x'];
        let line = [b"get ".as_slice(), &key, b"\r\n"].concat();
        assert_eq!(keys(&req(&line)), vec![key.to_vec()], "byte {b:#04x}");
        let line = [b"set ".as_slice(), &key, b" 0 0 1\r\nv\r\n"].concat();
        match req(&line) {
            Request::Store(Store { key: k, .. }) => assert_eq!(k, key, "byte {b:#04x}"),
            other => panic!("{other:?}"),
        }
        let line = [b"mg ".as_slice(), &key, b" k v\r\n"].concat();
        assert_eq!(meta(&req(&line)).key.raw, key, "byte {b:#04x}");
        let line = [b"ms ".as_slice(), &key, b" 1\r\nv\r\n"].concat();
        assert_eq!(meta(&req(&line)).key.raw, key, "byte {b:#04x}");
    }
    // 250 control bytes are a key; 251 are refused like any key that is too long.
    let long: Vec<u8> = (0..250u8).map(|i| 1 + i % 9).collect();
    let line = [b"get ".as_slice(), &long, b"\r\n"].concat();
    assert_eq!(keys(&req(&line)), vec![long.clone()]);
    let line = [b"set ".as_slice(), &long, b"\x01 0 0 1\r\nv\r\n"].concat();
    assert_eq!(p(&line), rec(line.len() - 3, FORMAT));
    let line = [b"mg ".as_slice(), &long, b"\x01 v\r\n"].concat();
    bad_line(&line, FORMAT);
    // A NUL ends the line for the tokenizer (memcached reads it as a C string); the rest of the
    // line is consumed unread.
    let r = p(b"get a\x00b c\r\nversion\r\n").unwrap();
    assert_eq!((keys(&r.0), r.1), (vec![b"a".to_vec()], 11));
    bad_line(b"set k\x00x 0 0 1\r\n", "ERROR\r\n");
    bad_line(b"ms k\x00y 1\r\n", FORMAT);
    bad_line(b"\x00\x01\x02\r\n", "ERROR\r\n");
    assert!(matches!(req(b"mn\x00junk\r\n"), Request::MetaNoop));
}

#[test]
fn overlong_lines_close_the_connection() {
    let limits = Limits {
        max_line_len: 16,
        ..Limits::default()
    };
    let parse = |b: &[u8]| parse_request(b, &limits).map(|(_, n)| n);
    // Exactly at the limit, with either terminator.
    assert_eq!(parse(b"get aaaaaaaaaaaa\r\n"), Ok(18));
    assert_eq!(parse(b"get aaaaaaaaaaaa\n"), Ok(17));
    // One byte over, complete or not.
    assert!(matches!(
        parse(b"get aaaaaaaaaaaaa\r\n"),
        Err(ParseError::Fatal { .. })
    ));
    assert!(matches!(
        parse(b"get aaaaaaaaaaaaaaaaaa"),
        Err(ParseError::Fatal { .. })
    ));
    // Still possibly fine while not longer than the limit plus CRLF.
    assert_eq!(parse(b"get aaaaaaaaaaaa\r"), Err(ParseError::Incomplete));
    // The data block does not count towards the line.
    assert!(parse(b"set k 0 0 20\r\n01234567890123456789\r\n").is_ok());
}

// --- retrieval ----------------------------------------------------------------------------------

#[test]
fn get_and_gets() {
    let r = req(b"get a bb ccc\r\n");
    assert!(matches!(
        r,
        Request::Get {
            with_cas: false,
            ..
        }
    ));
    assert_eq!(
        keys(&r),
        vec![b"a".to_vec(), b"bb".to_vec(), b"ccc".to_vec()]
    );
    let r = req(b"gets   a    a  \r\n");
    assert!(matches!(r, Request::Get { with_cas: true, .. }));
    assert_eq!(keys(&r), vec![b"a".to_vec(), b"a".to_vec()]);
    // `noreply` is just a key to a get.
    assert_eq!(keys(&req(b"get a noreply\r\n")).len(), 2);
    bad_line(b"get\r\n", "ERROR\r\n");
    bad_line(b"get \r\n", "ERROR\r\n");
    bad_line(b"gets\r\n", "ERROR\r\n");
    bad_line(b"getx a\r\n", "ERROR\r\n");
}

#[test]
fn gat_and_gats() {
    let r = req(b"gat 100 a b\r\n");
    assert!(matches!(
        r,
        Request::Gat {
            exptime: 100,
            with_cas: false,
            ..
        }
    ));
    assert_eq!(keys(&r).len(), 2);
    assert!(matches!(
        req(b"gats -1 a\r\n"),
        Request::Gat {
            exptime: -1,
            with_cas: true,
            ..
        }
    ));
    // An exptime and no key is an empty get.
    let r = req(b"gat 10\r\n");
    assert!(matches!(&r, Request::Gat { keys, .. } if keys.is_empty()));
    bad_line(b"gat\r\n", "ERROR\r\n");
    bad_line(b"gat x k\r\n", "CLIENT_ERROR invalid exptime argument\r\n");
    bad_line(
        b"gats 1x k\r\n",
        "CLIENT_ERROR invalid exptime argument\r\n",
    );
}

#[test]
fn key_length_limit_applies_to_every_key() {
    let k250 = "k".repeat(250);
    let k251 = "k".repeat(251);
    assert_eq!(keys(&req(format!("get {k250}\r\n").as_bytes())).len(), 1);
    bad_line(format!("get {k251}\r\n").as_bytes(), FORMAT);
    bad_line(format!("get a {k251} b\r\n").as_bytes(), FORMAT);
    bad_line(format!("gat 1 {k251}\r\n").as_bytes(), FORMAT);
    bad_line(format!("set {k251} 0 0 1\r\n").as_bytes(), FORMAT);
    bad_line(format!("set {k251} 0 0 1 noreply\r\n").as_bytes(), "");
    bad_line(format!("delete {k251}\r\n").as_bytes(), FORMAT);
    bad_line(format!("incr {k251} 1\r\n").as_bytes(), FORMAT);
    bad_line(format!("touch {k251} 1\r\n").as_bytes(), FORMAT);
    bad_line(format!("mg {k251} v\r\n").as_bytes(), FORMAT);
    bad_line(format!("ms {k251} 1\r\n").as_bytes(), FORMAT);
    bad_line(format!("md {k251}\r\n").as_bytes(), FORMAT);
    bad_line(format!("ma {k251}\r\n").as_bytes(), FORMAT);
    bad_line(format!("me {k251}\r\n").as_bytes(), FORMAT);
}

#[test]
fn too_many_keys_is_refused() {
    let limits = Limits {
        max_keys_per_get: 3,
        ..Limits::default()
    };
    assert!(parse_request(b"get a b c\r\n", &limits).is_ok());
    assert_eq!(
        parse_request(b"get a b c d\r\n", &limits),
        Err(ParseError::Recoverable {
            consumed: 13,
            reply: "CLIENT_ERROR too many keys\r\n".into()
        })
    );
}

#[test]
fn a_hundred_key_get_keeps_one_span() {
    let line: String = std::iter::once("get".to_string())
        .chain((0..100).map(|i| format!("key:{i}")))
        .collect::<Vec<_>>()
        .join(" ")
        + "\r\n";
    let r = req(line.as_bytes());
    let Request::Get { keys, .. } = &r else {
        panic!()
    };
    assert_eq!(keys.len(), 100);
    assert_eq!(keys.iter().nth(99), Some(&b"key:99"[..]));
}

// --- storage ------------------------------------------------------------------------------------

#[test]
fn storage_commands() {
    let cases: [(&[u8], StoreMode); 6] = [
        (b"set k 1 2 3\r\nabc\r\n", StoreMode::Set),
        (b"add k 1 2 3\r\nabc\r\n", StoreMode::Add),
        (b"replace k 1 2 3\r\nabc\r\n", StoreMode::Replace),
        (b"append k 1 2 3\r\nabc\r\n", StoreMode::Append),
        (b"prepend k 1 2 3\r\nabc\r\n", StoreMode::Prepend),
        (b"cas k 1 2 3 77\r\nabc\r\n", StoreMode::Cas(77)),
    ];
    for (input, mode) in cases {
        let expected = Request::Store(Store {
            mode,
            key: b"k",
            flags: 1,
            exptime: 2,
            data: b"abc",
            noreply: false,
        });
        assert_eq!(req(input), expected);
    }
    assert!(matches!(
        req(b"set k 0 0 1 noreply\r\nx\r\n"),
        Request::Store(Store { noreply: true, .. })
    ));
    assert!(matches!(
        req(b"cas k 0 0 1 5 noreply\r\nx\r\n"),
        Request::Store(Store {
            noreply: true,
            mode: StoreMode::Cas(5),
            ..
        })
    ));
    // A sixth token that is not `noreply` is ignored, as memcached does.
    assert!(matches!(
        req(b"set k 0 0 1 foo\r\nx\r\n"),
        Request::Store(Store { noreply: false, .. })
    ));
    // Full ranges of the numbers.
    assert!(matches!(
        req(b"set k 4294967295 -1 0\r\n\r\n"),
        Request::Store(Store {
            flags: u32::MAX,
            exptime: -1,
            data: b"",
            ..
        })
    ));
    assert!(matches!(
        req(b"set k +5 0 1\r\nx\r\n"),
        Request::Store(Store { flags: 5, .. })
    ));
    assert!(matches!(
        req(b"cas k 0 0 1 18446744073709551615\r\nx\r\n"),
        Request::Store(Store {
            mode: StoreMode::Cas(u64::MAX),
            ..
        })
    ));
}

#[test]
fn storage_arity_errors() {
    bad_line(b"set\r\n", "ERROR\r\n");
    bad_line(b"set k 0 0\r\n", "ERROR\r\n");
    bad_line(b"set k 0 0 3 noreply extra\r\n", "ERROR\r\n");
    bad_line(b"cas k 0 0 1\r\n", "ERROR\r\n");
    bad_line(b"cas k 0 0 1 1 noreply x\r\n", "ERROR\r\n");
}

#[test]
fn storage_number_errors_leave_the_data_to_be_parsed_as_a_command() {
    for line in [
        &b"set k x 0 1\r\n"[..],
        b"set k -1 0 1\r\n",
        b"set k 4294967296 0 1\r\n",
        b"set k 0 x 1\r\n",
        b"set k 0 0 abc\r\n",
        b"set k 0 0 -1\r\n",
        b"set k 0 0 2147483646\r\n",
        b"append k x y 1\r\n",
        b"cas k 0 0 1 x\r\n",
        b"cas k 0 0 1 -1\r\n",
    ] {
        let mut input = line.to_vec();
        input.extend_from_slice(b"x\r\n");
        assert_eq!(
            p(&input),
            rec(line.len(), FORMAT),
            "{:?}",
            String::from_utf8_lossy(line)
        );
    }
    // noreply silences the error but still only the line is consumed.
    assert_eq!(p(b"set k 0 0 abc noreply\r\nabc\r\n"), rec(23, ""));
    assert_eq!(p(b"cas k 0 0 1 x noreply\r\nx\r\n"), rec(23, ""));
}

#[test]
fn oversized_values_are_swallowed_without_buffering() {
    let limits = Limits {
        max_value_len: 10,
        ..Limits::default()
    };
    let parse = |b: &'static [u8]| parse_request(b, &limits);
    let line = b"set k 0 0 11\r\n";
    let expected = Err(ParseError::Recoverable {
        consumed: line.len() + 13,
        reply: "SERVER_ERROR object too large for cache\r\n".into(),
    });
    // Answered as soon as the line is in: `consumed` reaches past the buffer.
    assert_eq!(parse(line), expected);
    assert_eq!(parse(b"set k 0 0 11\r\n0123456789a\r\n"), expected);
    assert_eq!(
        parse(b"set k 0 0 10\r\n0123456789\r\n").map(|(_, n)| n),
        Ok(26)
    );
    assert_eq!(
        parse(b"set k 0 0 11 noreply\r\n"),
        Err(ParseError::Recoverable {
            consumed: 22 + 13,
            reply: "".into()
        })
    );
    // A huge length is refused the same way (memcached: up to INT_MAX - 2).
    assert_eq!(
        parse(b"set k 0 0 2147483645\r\n"),
        Err(ParseError::Recoverable {
            consumed: 22 + 2147483647,
            reply: "SERVER_ERROR object too large for cache\r\n".into()
        })
    );
}

#[test]
fn bad_data_chunk_consumes_exactly_the_announced_length_plus_two() {
    // memcached reads 5 bytes ("abcde"), sees no CRLF at the end, and goes on with "\r\n".
    assert_eq!(
        p(b"set k 0 0 3\r\nabcde\r\n"),
        rec(18, "CLIENT_ERROR bad data chunk\r\n")
    );
    assert_eq!(
        p(b"set k 0 0 3\r\nabc\nget k\r\n"),
        rec(18, "CLIENT_ERROR bad data chunk\r\n")
    );
    assert_eq!(p(b"set k 0 0 3 noreply\r\nabcde\r\n"), rec(26, ""));
    // Waits for the whole block before judging it.
    assert_eq!(p(b"set k 0 0 3\r\nabcd"), Err(ParseError::Incomplete));
}

// --- other text commands ------------------------------------------------------------------------

#[test]
fn delete() {
    assert_eq!(
        req(b"delete k\r\n"),
        Request::Delete {
            key: b"k",
            noreply: false
        }
    );
    assert_eq!(
        req(b"delete k noreply\r\n"),
        Request::Delete {
            key: b"k",
            noreply: true
        }
    );
    assert_eq!(
        req(b"delete k 0\r\n"),
        Request::Delete {
            key: b"k",
            noreply: false
        }
    );
    assert_eq!(
        req(b"delete k 0 noreply\r\n"),
        Request::Delete {
            key: b"k",
            noreply: true
        }
    );
    let usage = "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n";
    bad_line(b"delete k x\r\n", usage);
    bad_line(b"delete k 5\r\n", usage);
    bad_line(b"delete k x noreply\r\n", "");
    bad_line(b"delete\r\n", "ERROR\r\n");
    bad_line(b"delete a b c d\r\n", "ERROR\r\n");
}

#[test]
fn incr_decr() {
    assert_eq!(
        req(b"incr k 5\r\n"),
        Request::Arith {
            key: b"k",
            delta: 5,
            incr: true,
            noreply: false
        }
    );
    assert_eq!(
        req(b"decr k 18446744073709551615 noreply\r\n"),
        Request::Arith {
            key: b"k",
            delta: u64::MAX,
            incr: false,
            noreply: true
        }
    );
    assert_eq!(
        req(b"incr k +5\r\n"),
        Request::Arith {
            key: b"k",
            delta: 5,
            incr: true,
            noreply: false
        }
    );
    // A third argument that is not `noreply` is ignored.
    assert_eq!(
        req(b"incr k 1 x\r\n"),
        Request::Arith {
            key: b"k",
            delta: 1,
            incr: true,
            noreply: false
        }
    );
    let delta = "CLIENT_ERROR invalid numeric delta argument\r\n";
    bad_line(b"incr k x\r\n", delta);
    bad_line(b"incr k -1\r\n", delta);
    bad_line(b"incr k 18446744073709551616\r\n", delta);
    bad_line(b"incr k x noreply\r\n", "");
    bad_line(b"decr k\r\n", "ERROR\r\n");
    bad_line(b"incr k 1 2 3\r\n", "ERROR\r\n");
}

#[test]
fn touch() {
    assert_eq!(
        req(b"touch k 10\r\n"),
        Request::Touch {
            key: b"k",
            exptime: 10,
            noreply: false
        }
    );
    assert_eq!(
        req(b"touch k -1 noreply\r\n"),
        Request::Touch {
            key: b"k",
            exptime: -1,
            noreply: true
        }
    );
    assert_eq!(
        req(b"touch k 10 x\r\n"),
        Request::Touch {
            key: b"k",
            exptime: 10,
            noreply: false
        }
    );
    bad_line(
        b"touch k x\r\n",
        "CLIENT_ERROR invalid exptime argument\r\n",
    );
    bad_line(b"touch k x noreply\r\n", "");
    bad_line(b"touch k\r\n", "ERROR\r\n");
}

#[test]
fn flush_all() {
    assert_eq!(
        req(b"flush_all\r\n"),
        Request::FlushAll {
            delay: None,
            noreply: false
        }
    );
    assert_eq!(
        req(b"flush_all 0\r\n"),
        Request::FlushAll {
            delay: Some(0),
            noreply: false
        }
    );
    assert_eq!(
        req(b"flush_all noreply\r\n"),
        Request::FlushAll {
            delay: None,
            noreply: true
        }
    );
    assert_eq!(
        req(b"flush_all 10 noreply\r\n"),
        Request::FlushAll {
            delay: Some(10),
            noreply: true
        }
    );
    assert_eq!(
        req(b"flush_all -1\r\n"),
        Request::FlushAll {
            delay: Some(-1),
            noreply: false
        }
    );
    assert_eq!(
        req(b"flush_all 1 2\r\n"),
        Request::FlushAll {
            delay: Some(1),
            noreply: false
        }
    );
    bad_line(
        b"flush_all x\r\n",
        "CLIENT_ERROR invalid exptime argument\r\n",
    );
    bad_line(b"flush_all x noreply\r\n", "");
    bad_line(
        b"flush_all noreply x\r\n",
        "CLIENT_ERROR invalid exptime argument\r\n",
    );
    bad_line(b"flush_all 1 2 3\r\n", "ERROR\r\n");
}

#[test]
fn verbosity() {
    assert_eq!(
        req(b"verbosity 1\r\n"),
        Request::Verbosity {
            level: 1,
            noreply: false
        }
    );
    assert_eq!(
        req(b"verbosity 1 noreply\r\n"),
        Request::Verbosity {
            level: 1,
            noreply: true
        }
    );
    assert_eq!(
        req(b"verbosity 1 2\r\n"),
        Request::Verbosity {
            level: 1,
            noreply: false
        }
    );
    bad_line(b"verbosity x\r\n", FORMAT);
    bad_line(b"verbosity noreply\r\n", "");
    bad_line(b"verbosity\r\n", "ERROR\r\n");
    bad_line(b"verbosity 1 2 3\r\n", "ERROR\r\n");
}

#[test]
fn stats_version_quit() {
    assert_eq!(req(b"stats\r\n"), Request::Stats { arg: None });
    assert_eq!(
        req(b"stats settings x\r\n"),
        Request::Stats {
            arg: Some(b"settings")
        }
    );
    assert_eq!(req(b"version extra\r\n"), Request::Version);
    assert_eq!(req(b"quit\r\n"), Request::Quit);
    assert_eq!(req(b"quit now\r\n"), Request::Quit);
    assert_eq!(req(b"mn\r\n"), Request::MetaNoop);
    assert_eq!(req(b"mn extra\r\n"), Request::MetaNoop);
}

// --- meta commands ------------------------------------------------------------------------------

#[test]
fn meta_get_flags() {
    let r = req(b"mg k s v f t c k O99 h l q u\r\n");
    let Request::MetaGet(m) = r else {
        panic!("{r:?}")
    };
    assert_eq!(m.key, MetaKey::text(b"k"));
    for f in *b"svftckOhlqu" {
        assert!(m.flags.has(f), "{}", f as char);
    }
    assert!(!m.flags.has(b'T') && !m.flags.has(b'b'));
    assert_eq!(m.flags.opaque(), Some(&b"99"[..]));
    assert!(m.flags.quiet());
    assert_eq!(
        m.flags.tokens().map(|t| t[0]).collect::<Vec<_>>(),
        b"svftckOhlqu".to_vec()
    );
    let r = req(b"mg k T30 N-1 R5 P L\r\n");
    assert_eq!(
        p(b"mg k T30 N-1 R5 Pfoo Lbar\r\n").map(|(r, _)| meta(&r).flags.ttl()),
        Ok(Some(30))
    );
    assert_eq!(r, Request::MetaGet(meta(&r)));
    // `mg` with no flag at all is a plain existence check.
    assert!(matches!(req(b"mg k\r\n"), Request::MetaGet(m) if m.flags.is_empty()));
    assert!(
        matches!(req(b"mg k  v \r\n"), Request::MetaGet(m) if m.flags.has(b'v') && m.flags.len() == 1)
    );
    // Flags memcached accepts and ignores for mg.
    assert!(p(b"mg k C5 F3 M9 J1 D1 I\r\n").is_ok());
}

#[test]
fn meta_flag_errors() {
    bad_line(b"mg k v v\r\n", "CLIENT_ERROR duplicate flag\r\n");
    bad_line(b"mg k P L Pfoo\r\n", "CLIENT_ERROR duplicate flag\r\n");
    bad_line(b"mg k \xc3\xa9\r\n", "CLIENT_ERROR duplicate flag\r\n");
    bad_line(b"mg k zz\r\n", "CLIENT_ERROR invalid flag\r\n");
    bad_line(
        b"mg k E\r\n",
        "CLIENT_ERROR bad token in command line format\r\n",
    );
    bad_line(
        b"mg k Tx\r\n",
        "CLIENT_ERROR bad token in command line format\r\n",
    );
    bad_line(
        b"mg k T\r\n",
        "CLIENT_ERROR bad token in command line format\r\n",
    );
    bad_line(
        b"mg k N\r\n",
        "CLIENT_ERROR bad token in command line format\r\n",
    );
    bad_line(
        b"mg k MSS\r\n",
        "CLIENT_ERROR incorrect length for M token\r\n",
    );
    bad_line(
        b"mg k Jx\r\n",
        "CLIENT_ERROR invalid numeric initial value\r\n",
    );
    bad_line(
        b"mg k Dx\r\n",
        "CLIENT_ERROR invalid numeric delta value\r\n",
    );
    bad_line(b"mg k Fx\r\n", FORMAT);
    // The last problem wins, except that an F problem keeps the earlier message; an unknown or
    // duplicate flag stops the scan.
    bad_line(
        b"mg k Tx MSS\r\n",
        "CLIENT_ERROR incorrect length for M token\r\n",
    );
    bad_line(
        b"mg k Tx Fx\r\n",
        "CLIENT_ERROR bad token in command line format\r\n",
    );
    bad_line(b"mg k Tx zz\r\n", "CLIENT_ERROR invalid flag\r\n");
    bad_line(b"mg k zz Tx\r\n", "CLIENT_ERROR invalid flag\r\n");
    bad_line(b"mg\r\n", "ERROR\r\n");
    // q does not silence errors.
    bad_line(b"mg k q zz\r\n", "CLIENT_ERROR invalid flag\r\n");
}

#[test]
fn meta_flag_count_and_opaque_limits() {
    let flags17 = (1..=17)
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(" ");
    let flags18 = (1..=18)
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(" ");
    bad_line(
        format!("mg k {flags17}\r\n").as_bytes(),
        "CLIENT_ERROR invalid flag\r\n",
    );
    bad_line(
        format!("mg k {flags18}\r\n").as_bytes(),
        "CLIENT_ERROR options flags are too long\r\n",
    );
    bad_line(
        format!("md k {flags18}\r\n").as_bytes(),
        "CLIENT_ERROR options flags too long\r\n",
    );
    bad_line(
        format!("ma k {flags18}\r\n").as_bytes(),
        "CLIENT_ERROR options flags too long\r\n",
    );
    // ms: not swallowed, the length is not trusted yet.
    bad_line(
        format!("ms k 1 {flags18}\r\n").as_bytes(),
        "CLIENT_ERROR options flags too long\r\n",
    );
    let o31 = "x".repeat(31);
    let o32 = "x".repeat(32);
    assert!(p(format!("mg k O{o31}\r\n").as_bytes()).is_ok());
    bad_line(
        format!("mg k O{o32}\r\n").as_bytes(),
        "CLIENT_ERROR opaque token too long\r\n",
    );
    bad_line(
        format!("md k O{o32}\r\n").as_bytes(),
        "CLIENT_ERROR opaque token too long\r\n",
    );
    bad_line(
        format!("ma k O{o32}\r\n").as_bytes(),
        "CLIENT_ERROR opaque token too long\r\n",
    );
    assert_eq!(
        req(b"mg k O\r\n"),
        Request::MetaGet(Meta {
            key: MetaKey::text(b"k"),
            flags: MetaFlags::new(b"O").unwrap()
        })
    );
}

#[test]
fn base64_keys() {
    let r = req(b"mg YWJj b k v\r\n");
    let m = meta(&r);
    assert_eq!(
        m.key,
        MetaKey {
            raw: b"YWJj",
            base64: true
        }
    );
    assert_eq!(&*m.key.bytes(), b"abc");
    assert_eq!(&*MetaKey::text(b"YWJj").bytes(), b"YWJj");
    for bad in [
        &b"mg k b\r\n"[..],
        b"mg YQ b\r\n",
        b"mg !!! b\r\n",
        b"mg YW-j b\r\n",
    ] {
        bad_line(bad, "CLIENT_ERROR error decoding key\r\n");
    }
    bad_line(
        b"md !!!! b\r\n",
        "CLIENT_ERROR invalid or duplicate flag\r\n",
    );
    // 248 characters of base64 decode to 186 bytes, still on the stack...
    let raw = "QUFB".repeat(62);
    let line = format!("mg {raw} b\r\n");
    let r = req(line.as_bytes());
    assert!(matches!(
        meta(&r).key.bytes(),
        KeyBytes::Inline { len: 186, .. }
    ));
    // ...and longer keys (with a raised key limit) on the heap.
    let long = Limits {
        max_key_len: 400,
        ..Limits::default()
    };
    let raw = "QUFB".repeat(90);
    let line = format!("mg {raw} b\r\n");
    let (r, _) = parse_request(line.as_bytes(), &long).unwrap();
    assert_eq!(&*meta(&r).key.bytes(), "A".repeat(270).as_bytes());
}

#[test]
fn meta_set() {
    let r = req(b"ms k 3 T10 F5 c k O1 MA C9 E7\r\nabc\r\n");
    let Request::MetaSet { meta, data } = r else {
        panic!("{r:?}")
    };
    assert_eq!(data, b"abc");
    assert_eq!(meta.flags.ttl(), Some(10));
    assert_eq!(meta.flags.client_flags(), Some(5));
    assert_eq!(meta.flags.mode(), Some(b'A'));
    assert_eq!(meta.flags.compare_cas(), Some(9));
    assert_eq!(meta.flags.new_cas(), Some(7));
    assert!(matches!(
        req(b"ms k 0\r\n\r\n"),
        Request::MetaSet { data: b"", .. }
    ));
    for mode in [b'E', b'A', b'P', b'R', b'S'] {
        let line = [&b"ms k 1 M"[..], &[mode], b"\r\nx\r\n"].concat();
        assert!(p(&line).is_ok());
    }
}

#[test]
fn meta_set_errors() {
    // Errors before the length is known do not swallow.
    bad_line(b"ms\r\n", "ERROR\r\n");
    bad_line(b"ms k\r\n", FORMAT);
    bad_line(b"ms k x\r\n", FORMAT);
    bad_line(b"ms k -1\r\n", FORMAT);
    // After it is known they do, answered even with q.
    let swallowed = |line: &[u8], reply: &str| {
        assert_eq!(
            p(line),
            rec(line.len() + 3, reply),
            "{:?}",
            String::from_utf8_lossy(line)
        );
    };
    swallowed(b"ms k 1 zz\r\n", "CLIENT_ERROR invalid flag\r\n");
    swallowed(b"ms k 1 T0 T0\r\n", "CLIENT_ERROR duplicate flag\r\n");
    swallowed(b"ms k 1 Fx\r\n", FORMAT);
    swallowed(
        b"ms k 1 Tx\r\n",
        "CLIENT_ERROR bad token in command line format\r\n",
    );
    swallowed(
        b"ms k 1 Cx\r\n",
        "CLIENT_ERROR bad token in command line format\r\n",
    );
    swallowed(
        b"ms k 1 Ex\r\n",
        "CLIENT_ERROR bad token in command line format\r\n",
    );
    swallowed(
        b"ms k 1 MX q\r\n",
        "CLIENT_ERROR invalid mode for ms M token\r\n",
    );
    swallowed(
        b"ms k 1 Ms\r\n",
        "CLIENT_ERROR invalid mode for ms M token\r\n",
    );
    swallowed(
        b"ms k 1 MSS\r\n",
        "CLIENT_ERROR incorrect length for M token\r\n",
    );
    swallowed(b"ms k 1 b\r\n", "CLIENT_ERROR error decoding key\r\n");
    swallowed(
        format!("ms k 1 O{}\r\n", "x".repeat(32)).as_bytes(),
        "CLIENT_ERROR opaque token too long\r\n",
    );
    // The mode is judged before the opaque token.
    swallowed(
        format!("ms k 1 O{} MX\r\n", "x".repeat(32)).as_bytes(),
        "CLIENT_ERROR invalid mode for ms M token\r\n",
    );
    // Too large, and a bad chunk, are reported even with q.
    let limits = Limits {
        max_value_len: 2,
        ..Limits::default()
    };
    assert_eq!(
        parse_request(b"ms k 3 q\r\n", &limits),
        Err(ParseError::Recoverable {
            consumed: 15,
            reply: "SERVER_ERROR object too large for cache\r\n".into()
        })
    );
    assert_eq!(
        p(b"ms k 2 q\r\nxxx\r\n"),
        rec(14, "CLIENT_ERROR bad data chunk\r\n")
    );
}

#[test]
fn meta_delete_and_arith() {
    let r = req(b"md k q C5 I T30 k O1\r\n");
    assert!(matches!(r, Request::MetaDelete(_)));
    assert_eq!(meta(&r).flags.compare_cas(), Some(5));
    let r = req(b"ma k N0 J7 D3 MD v t c\r\n");
    assert!(matches!(r, Request::MetaArith(_)));
    let f = meta(&r).flags;
    assert_eq!(
        (f.vivify(), f.initial(), f.delta(), f.mode()),
        (Some(0), Some(7), Some(3), Some(b'D'))
    );
    for mode in ["I", "+", "D", "-"] {
        assert!(p(format!("ma k M{mode}\r\n").as_bytes()).is_ok());
    }
    let invalid = "CLIENT_ERROR invalid or duplicate flag\r\n";
    for line in [
        &b"md k Tx\r\n"[..],
        b"md k zz\r\n",
        b"md k v v\r\n",
        b"ma k Dx\r\n",
        b"ma k Jx\r\n",
        b"ma k zz\r\n",
        b"ma k t T1 t\r\n",
        b"md k E\r\n",
        b"ma k Ex\r\n",
    ] {
        bad_line(line, invalid);
    }
    // E (memcached 1.6.21+) is known to every meta command.
    for line in [&b"mg k E5 N30\r\n"[..], b"md k E5 I\r\n", b"ma k E5\r\n"] {
        assert_eq!(meta(&req(line)).flags.new_cas(), Some(5));
    }
    bad_line(
        b"ma k MX\r\n",
        "CLIENT_ERROR invalid mode for ma M token\r\n",
    );
    bad_line(
        b"ma k Mi\r\n",
        "CLIENT_ERROR invalid mode for ma M token\r\n",
    );
    bad_line(b"md\r\n", "ERROR\r\n");
    bad_line(b"ma\r\n", "ERROR\r\n");
}

#[test]
fn meta_debug() {
    assert_eq!(
        req(b"me k\r\n"),
        Request::MetaDebug {
            key: MetaKey::text(b"k")
        }
    );
    assert_eq!(
        req(b"me YQ== b\r\n"),
        Request::MetaDebug {
            key: MetaKey {
                raw: b"YQ==",
                base64: true
            }
        }
    );
    assert_eq!(
        req(b"me k x y\r\n"),
        Request::MetaDebug {
            key: MetaKey::text(b"k")
        }
    );
    bad_line(b"me\r\n", FORMAT);
    bad_line(b"me !!! b\r\n", FORMAT);
    bad_line(b"me a b c\r\n", FORMAT);
}

#[test]
fn meta_flags_builder() {
    let f = MetaFlags::new(b" v  t T30 ").unwrap();
    assert_eq!(f.as_bytes(), b"v  t T30");
    assert_eq!(f.len(), 3);
    assert_eq!(f.ttl(), Some(30));
    assert!(MetaFlags::new(b"v v").is_none());
    assert!(MetaFlags::new(b"E5").is_some());
    assert!(MetaFlags::new(b"").unwrap().is_empty());
}

#[test]
fn compose_examples() {
    let mut out = Vec::new();
    let reqs = [
        (
            Request::Get {
                keys: Keys::new(b"a  b"),
                with_cas: true,
            },
            &b"gets a b\r\n"[..],
        ),
        (
            Request::Gat {
                exptime: -5,
                keys: Keys::new(b""),
                with_cas: false,
            },
            b"gat -5\r\n",
        ),
        (
            Request::Store(Store {
                mode: StoreMode::Cas(9),
                key: b"k",
                flags: 1,
                exptime: 2,
                data: b"v\r\n",
                noreply: true,
            }),
            b"cas k 1 2 3 9 noreply\r\nv\r\n\r\n",
        ),
        (
            Request::FlushAll {
                delay: Some(3),
                noreply: false,
            },
            b"flush_all 3\r\n",
        ),
        (
            Request::MetaDebug {
                key: MetaKey {
                    raw: b"YQ==",
                    base64: true,
                },
            },
            b"me YQ== b\r\n",
        ),
        (
            Request::MetaSet {
                meta: Meta {
                    key: MetaKey::text(b"k"),
                    flags: MetaFlags::new(b"T5 c").unwrap(),
                },
                data: b"xy",
            },
            b"ms k 2 T5 c\r\nxy\r\n",
        ),
    ];
    for (r, wire) in reqs {
        out.clear();
        compose_request(&r, &mut out);
        assert_eq!(String::from_utf8_lossy(&out), String::from_utf8_lossy(wire));
        assert_eq!(p(&out), Ok((r, out.len())));
    }
}
