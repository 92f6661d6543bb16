//! Invariants of the request parser over arbitrary input, checked by the cargo-fuzz target
//! `memcache_request` and by a property test. Each check panics on violation.

use super::{compose_request, parse_request, Limits, ParseError};

/// Parses `data` and checks what must hold whatever the bytes are:
///
/// 1. A parsed request consumed between 1 and `data.len()` bytes, and parsing exactly those
///    bytes gives the same result (the parser never looks past a request).
/// 2. Every strict prefix of a parsed request is `Incomplete`: a short read never yields a
///    different request or an error.
/// 3. Composing the request and parsing that gives the same request back, consuming all of it.
/// 4. An error consumes at least one byte; only a swallowed data block may reach past `data`.
pub fn check_parse(data: &[u8], limits: &Limits) {
    match parse_request(data, limits) {
        Ok((req, n)) => {
            assert!(n > 0 && n <= data.len(), "consumed {n} of {}", data.len());
            assert_eq!(
                parse_request(&data[..n], limits),
                Ok((req.clone(), n)),
                "result depends on bytes past the request"
            );
            for k in [0, 1, n / 2, n.saturating_sub(2), n - 1] {
                if k < n {
                    assert_eq!(
                        parse_request(&data[..k], limits),
                        Err(ParseError::Incomplete),
                        "prefix {k} of {n}"
                    );
                }
            }
            let mut wire = Vec::new();
            compose_request(&req, &mut wire);
            assert_eq!(
                parse_request(&wire, limits),
                Ok((req, wire.len())),
                "compose/parse round trip"
            );
        }
        Err(ParseError::Recoverable { consumed, reply }) => {
            assert!(consumed > 0);
            if consumed > data.len() {
                assert!(
                    reply.is_empty()
                        || reply.starts_with("SERVER_ERROR")
                        || reply.starts_with("CLIENT_ERROR"),
                    "only a swallowed data block reaches past the buffer: {reply:?}"
                );
            }
            assert!(reply.is_empty() || reply.ends_with("\r\n"));
        }
        Err(ParseError::Fatal { reply, .. }) => {
            assert!(reply.is_empty() || reply.ends_with("\r\n"))
        }
        Err(ParseError::Incomplete) => {}
    }
}

/// Feeds `data` through the parser as a connection would (request after request, dropping what
/// each error consumes) and checks [`check_parse`] at every step.
pub fn check_stream(data: &[u8], limits: &Limits) {
    let mut pos = 0;
    while pos < data.len() {
        let rest = &data[pos..];
        check_parse(rest, limits);
        match parse_request(rest, limits) {
            Ok((_, n)) => pos += n,
            Err(ParseError::Recoverable { consumed, .. }) => pos = pos.saturating_add(consumed),
            Err(ParseError::Fatal { .. } | ParseError::Incomplete) => break,
        }
    }
}
