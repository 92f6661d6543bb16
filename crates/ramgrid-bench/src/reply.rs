//! Parsing of memcached text-protocol replies: just enough to validate every reply the generator asked for.
//!
//! The parsers are pure functions over the bytes received so far. `Status::Incomplete` means "read more";
//! anything the generator did not expect is a `ReplyError`, which stops the run (a benchmark that counts
//! error replies as successes measures nothing).

use std::fmt;

/// Longest header line we wait for before calling the stream garbage.
const MAX_LINE: usize = 4096;
/// Largest value length we believe; a bigger one is a corrupt header, not a value to wait for.
const MAX_VALUE: usize = 128 << 20;

/// Outcome of parsing one reply from the front of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// The reply is not complete yet: read more bytes and parse again from the same start.
    Incomplete,
    /// One whole reply: `consumed` bytes, of which `hits` were VALUE items.
    Complete { consumed: usize, hits: u32 },
}

/// A reply the generator did not ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyError {
    /// The server answered with ERROR, CLIENT_ERROR or SERVER_ERROR.
    Server(String),
    /// The bytes are not a reply of the expected kind.
    Malformed(String),
    /// A VALUE carried a key that was not requested (or came out of request order).
    UnexpectedKey(String),
}

impl fmt::Display for ReplyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplyError::Server(line) => write!(f, "server replied with an error: {line:?}"),
            ReplyError::Malformed(what) => write!(f, "malformed reply: {what}"),
            ReplyError::UnexpectedKey(key) => {
                write!(f, "reply carries a key not requested: {key:?}")
            }
        }
    }
}

impl std::error::Error for ReplyError {}

/// Shows at most 80 bytes of a line, lossily, for error messages.
fn show(line: &[u8]) -> String {
    let cut = &line[..line.len().min(80)];
    String::from_utf8_lossy(cut).into_owned()
}

/// The first CRLF-terminated line of `buf` without its terminator; `None` while it is incomplete.
fn first_line(buf: &[u8]) -> Result<Option<&[u8]>, ReplyError> {
    match buf.iter().position(|&b| b == b'\n') {
        Some(nl) if nl > 0 && buf[nl - 1] == b'\r' => Ok(Some(&buf[..nl - 1])),
        Some(_) => Err(ReplyError::Malformed(format!(
            "line not terminated by CRLF: {:?}",
            show(buf)
        ))),
        None if buf.len() > MAX_LINE => Err(ReplyError::Malformed(format!(
            "no line end within {MAX_LINE} bytes: {:?}",
            show(buf)
        ))),
        None => Ok(None),
    }
}

/// Maps a line that is not the expected reply to the most telling error.
fn unexpected(line: &[u8]) -> ReplyError {
    let is_error =
        line == b"ERROR" || line.starts_with(b"CLIENT_ERROR") || line.starts_with(b"SERVER_ERROR");
    if is_error {
        ReplyError::Server(show(line))
    } else {
        ReplyError::Malformed(format!("unexpected line {:?}", show(line)))
    }
}

/// Parses a non-empty run of ASCII digits.
fn decimal(token: &[u8]) -> Option<u64> {
    if token.is_empty() || token.len() > 20 {
        return None;
    }
    token.iter().try_fold(0u64, |acc, &b| {
        if b.is_ascii_digit() {
            acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
        } else {
            None
        }
    })
}

/// Parses the reply to `get k1 .. kn`: zero or more `VALUE <key> <flags> <bytes> [<cas>]` items, then END.
///
/// `key_ok` is called once per VALUE with its key, in order, and must say whether that key was
/// requested; a fresh closure is expected per call, since an incomplete reply is parsed again from its start.
pub fn parse_get(buf: &[u8], mut key_ok: impl FnMut(&[u8]) -> bool) -> Result<Status, ReplyError> {
    let mut pos = 0;
    let mut hits = 0u32;
    loop {
        let Some(line) = first_line(&buf[pos..])? else {
            return Ok(Status::Incomplete);
        };
        let after_line = pos + line.len() + 2;
        if line == b"END" {
            return Ok(Status::Complete {
                consumed: after_line,
                hits,
            });
        }
        let Some(rest) = line.strip_prefix(b"VALUE ") else {
            return Err(unexpected(line));
        };
        let mut tokens = rest.split(|&b| b == b' ');
        let bad = || ReplyError::Malformed(format!("bad VALUE line {:?}", show(line)));
        let key = tokens.next().filter(|k| !k.is_empty()).ok_or_else(bad)?;
        let flags = tokens.next().and_then(decimal).ok_or_else(bad)?;
        let bytes = tokens.next().and_then(decimal).ok_or_else(bad)?;
        let cas_ok = tokens.next().is_none_or(|cas| decimal(cas).is_some());
        if u32::try_from(flags).is_err() || !cas_ok || tokens.next().is_some() {
            return Err(bad());
        }
        let bytes = usize::try_from(bytes)
            .ok()
            .filter(|&b| b <= MAX_VALUE)
            .ok_or_else(bad)?;
        if !key_ok(key) {
            return Err(ReplyError::UnexpectedKey(show(key)));
        }
        let data_end = after_line + bytes;
        if buf.len() < data_end + 2 {
            return Ok(Status::Incomplete);
        }
        if &buf[data_end..data_end + 2] != b"\r\n" {
            return Err(ReplyError::Malformed(format!(
                "value of {bytes} bytes for key {:?} is not followed by CRLF",
                show(key)
            )));
        }
        hits += 1;
        pos = data_end + 2;
    }
}

/// Parses the reply to a meta multi-get, `mg <k1> v k q` .. `mg <kn> v k q` then `mn`: zero or
/// more `VA <bytes> k<key>` items (misses are quiet), then `MN`. `key_ok` as for [`parse_get`].
pub fn parse_meta_get(
    buf: &[u8],
    mut key_ok: impl FnMut(&[u8]) -> bool,
) -> Result<Status, ReplyError> {
    let mut pos = 0;
    let mut hits = 0u32;
    loop {
        let Some(line) = first_line(&buf[pos..])? else {
            return Ok(Status::Incomplete);
        };
        let after_line = pos + line.len() + 2;
        if line == b"MN" {
            return Ok(Status::Complete {
                consumed: after_line,
                hits,
            });
        }
        let Some(rest) = line.strip_prefix(b"VA ") else {
            return Err(unexpected(line));
        };
        let mut tokens = rest.split(|&b| b == b' ');
        let bad = || ReplyError::Malformed(format!("bad VA line {:?}", show(line)));
        let bytes = tokens.next().and_then(decimal).ok_or_else(bad)?;
        let key = tokens
            .next()
            .and_then(|t| t.strip_prefix(b"k"))
            .filter(|k| !k.is_empty())
            .ok_or_else(bad)?;
        if tokens.next().is_some() {
            return Err(bad());
        }
        let bytes = usize::try_from(bytes)
            .ok()
            .filter(|&b| b <= MAX_VALUE)
            .ok_or_else(bad)?;
        if !key_ok(key) {
            return Err(ReplyError::UnexpectedKey(show(key)));
        }
        let data_end = after_line + bytes;
        if buf.len() < data_end + 2 {
            return Ok(Status::Incomplete);
        }
        if &buf[data_end..data_end + 2] != b"\r\n" {
            return Err(ReplyError::Malformed(format!(
                "value of {bytes} bytes for key {:?} is not followed by CRLF",
                show(key)
            )));
        }
        hits += 1;
        pos = data_end + 2;
    }
}

/// Parses the reply to a `set`: exactly `STORED`.
pub fn parse_stored(buf: &[u8]) -> Result<Status, ReplyError> {
    match first_line(buf)? {
        None => Ok(Status::Incomplete),
        Some(b"STORED") => Ok(Status::Complete {
            consumed: 8,
            hits: 0,
        }),
        Some(line) => Err(unexpected(line)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn any_key(_: &[u8]) -> bool {
        true
    }

    #[test]
    fn miss_is_a_complete_reply_without_hits() {
        assert_eq!(
            parse_get(b"END\r\nVALUE", any_key),
            Ok(Status::Complete {
                consumed: 5,
                hits: 0
            })
        );
    }

    #[test]
    fn hits_are_counted_with_and_without_cas() {
        let reply = b"VALUE a 0 3\r\nabc\r\nVALUE b 42 0 77\r\n\r\nEND\r\n";
        let mut seen = Vec::new();
        let status = parse_get(reply, |k| {
            seen.push(k.to_vec());
            true
        });
        assert_eq!(
            status,
            Ok(Status::Complete {
                consumed: reply.len(),
                hits: 2
            })
        );
        assert_eq!(seen, vec![b"a".to_vec(), b"b".to_vec()]);
    }

    #[test]
    fn value_bytes_may_contain_crlf_and_end() {
        let reply = b"VALUE k 0 7\r\nEND\r\n\r\n\r\nEND\r\n";
        assert_eq!(
            parse_get(reply, any_key),
            Ok(Status::Complete {
                consumed: reply.len(),
                hits: 1
            })
        );
    }

    #[test]
    fn every_proper_prefix_is_incomplete() {
        let reply = b"VALUE key:01 5 4\r\nwxyz\r\nVALUE key:02 0 1\r\nq\r\nEND\r\n";
        for cut in 0..reply.len() {
            assert_eq!(
                parse_get(&reply[..cut], any_key),
                Ok(Status::Incomplete),
                "prefix of {cut} bytes"
            );
        }
        let stored = b"STORED\r\n";
        for cut in 0..stored.len() {
            assert_eq!(parse_stored(&stored[..cut]), Ok(Status::Incomplete));
        }
    }

    #[test]
    fn stored_consumes_only_its_line() {
        assert_eq!(
            parse_stored(b"STORED\r\nSTORED\r\n"),
            Ok(Status::Complete {
                consumed: 8,
                hits: 0
            })
        );
    }

    #[test]
    fn error_replies_stop_the_run() {
        for line in [
            &b"ERROR\r\n"[..],
            b"SERVER_ERROR out of memory storing object\r\n",
            b"CLIENT_ERROR bad command line format\r\n",
        ] {
            assert!(matches!(
                parse_get(line, any_key),
                Err(ReplyError::Server(_))
            ));
            assert!(matches!(parse_stored(line), Err(ReplyError::Server(_))));
        }
    }

    #[test]
    fn garbage_is_malformed() {
        let cases: [&[u8]; 9] = [
            b"HELLO\r\n",
            b"END\n",
            b"VALUE k 0\r\n",
            b"VALUE k x 3\r\nabc\r\nEND\r\n",
            b"VALUE k 0 3 1 2\r\nabc\r\nEND\r\n",
            b"VALUE k 0 3\r\nabcd\r\nEND\r\n",
            b"VALUE  0 3\r\nabc\r\nEND\r\n",
            b"VALUE k 99999999999 3\r\nabc\r\nEND\r\n",
            b"VALUE k 0 999999999999\r\n",
        ];
        for case in cases {
            let got = parse_get(case, any_key);
            assert!(
                matches!(got, Err(ReplyError::Malformed(_))),
                "{:?} gave {got:?}",
                String::from_utf8_lossy(case)
            );
        }
        assert!(matches!(
            parse_stored(b"NOT_STORED\r\n"),
            Err(ReplyError::Malformed(_))
        ));
        let endless = vec![b'x'; MAX_LINE + 1];
        assert!(matches!(
            parse_get(&endless, any_key),
            Err(ReplyError::Malformed(_))
        ));
    }

    #[test]
    fn meta_get_replies_list_hits_then_mn() {
        let reply = b"VA 3 ka\r\nabc\r\nVA 0 kb\r\n\r\nMN\r\n";
        let mut seen = Vec::new();
        let status = parse_meta_get(reply, |k| {
            seen.push(k.to_vec());
            true
        });
        assert_eq!(
            status,
            Ok(Status::Complete {
                consumed: reply.len(),
                hits: 2
            })
        );
        assert_eq!(seen, vec![b"a".to_vec(), b"b".to_vec()]);
        for cut in 0..reply.len() {
            assert_eq!(
                parse_meta_get(&reply[..cut], any_key),
                Ok(Status::Incomplete)
            );
        }
        for bad in [
            &b"EN\r\nMN\r\n"[..],
            b"VA 3\r\nabc\r\nMN\r\n",
            b"VA 3 ka\r\nabcd\r\nMN\r\n",
        ] {
            assert!(matches!(
                parse_meta_get(bad, any_key),
                Err(ReplyError::Malformed(_))
            ));
        }
        assert!(matches!(
            parse_meta_get(b"CLIENT_ERROR bad command line format\r\n", any_key),
            Err(ReplyError::Server(_))
        ));
    }

    #[test]
    fn a_key_not_requested_is_rejected() {
        let got = parse_get(b"VALUE other 0 1\r\nx\r\nEND\r\n", |k| k == b"mine");
        assert_eq!(got, Err(ReplyError::UnexpectedKey("other".into())));
    }
}
