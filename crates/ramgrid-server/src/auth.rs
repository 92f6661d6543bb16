//! Authentication of connections, for both protocols, when the server has a token.
//!
//! - Native protocol: HELLO carries the token (docs/protocol-native.md).
//! - memcached text and meta protocols: memcached 1.6's own text-protocol authentication (its `-Y`
//!   auth file), so existing clients that support it work unchanged: the first request must be a
//!   `set` whose data block is `<user> <password>`. The password must be the token; the user name is
//!   not checked (a ramgrid server has one secret, not a user table). It is answered `STORED` (even
//!   with `noreply`, as memcached does) and nothing is stored. Any other request, or a wrong
//!   password, is refused with memcached's reply, the rest of what was read is dropped, and the
//!   connection may try again: what memcached 1.6.18 does (python/tests/integration/test_auth.py
//!   sends the same bytes to both).
//!
//! Either way a connection that has not authenticated within `--auth-timeout-secs` is closed, so
//! idle unauthenticated connections cannot hold `--max-conns` for long.

use ramgrid_proto::memcache::{Request, StoreMode};

/// memcached's reply to any request before authentication.
pub const UNAUTHENTICATED: &[u8] = b"CLIENT_ERROR unauthenticated\r\n";

/// What the first request of an unauthenticated memcached-protocol connection amounts to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemcacheAuth {
    /// A `set` whose data is `<user> <token>`: the connection is authenticated.
    Authenticated,
    /// A `set` whose data is two words, the second not the token.
    Failed,
    /// A `set` whose data is not two words.
    BadFormat,
    /// Any other request.
    NotAnAttempt,
}

impl MemcacheAuth {
    /// memcached's reply line. When more requests were pipelined behind a refused attempt, memcached
    /// answers `CLIENT_ERROR unauthenticated` instead (and drops them); the caller does the same.
    pub fn reply(self) -> &'static [u8] {
        match self {
            MemcacheAuth::Authenticated => b"STORED\r\n",
            MemcacheAuth::Failed => b"CLIENT_ERROR authentication failure\r\n",
            MemcacheAuth::BadFormat => b"CLIENT_ERROR bad authentication token format\r\n",
            MemcacheAuth::NotAnAttempt => UNAUTHENTICATED,
        }
    }
}

/// Compares a presented secret with the token without an early exit on the first difference.
pub fn token_matches(presented: &[u8], token: &str) -> bool {
    presented.len() == token.len()
        && presented
            .iter()
            .zip(token.as_bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// Judges `req`, the first request of an unauthenticated memcached-protocol connection, against
/// `token`. The data block is split on spaces as memcached does: the first word is the user (any
/// user is accepted: a ramgrid server has one secret, not a user table), the second the password,
/// and further words are ignored.
pub fn memcache_auth(req: &Request<'_>, token: &str) -> MemcacheAuth {
    let Request::Store(store) = req else {
        return MemcacheAuth::NotAnAttempt;
    };
    if store.mode != StoreMode::Set {
        return MemcacheAuth::NotAnAttempt;
    }
    let mut words = store.data.split(|&b| b == b' ').filter(|w| !w.is_empty());
    match (words.next(), words.next()) {
        (Some(_user), Some(password)) if token_matches(password, token) => {
            MemcacheAuth::Authenticated
        }
        (Some(_), Some(_)) => MemcacheAuth::Failed,
        _ => MemcacheAuth::BadFormat,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ramgrid_proto::memcache::{parse_request, Limits};

    fn first(bytes: &[u8]) -> MemcacheAuth {
        let (req, _) = parse_request(bytes, &Limits::default()).expect("parses");
        memcache_auth(&req, "tok")
    }

    #[test]
    fn memcached_text_auth() {
        use MemcacheAuth::*;
        assert_eq!(first(b"set any 0 0 8\r\nuser tok\r\n"), Authenticated);
        assert_eq!(first(b"set any 0 0 9\r\nuser  tok\r\n"), Authenticated);
        assert_eq!(first(b"set any 0 0 9\r\n user tok\r\n"), Authenticated);
        assert_eq!(first(b"set any 0 0 10\r\nuser tok x\r\n"), Authenticated);
        assert_eq!(
            first(b"set any 0 0 8 noreply\r\nuser tok\r\n"),
            Authenticated
        );
        assert_eq!(first(b"set any 0 0 8\r\nuser bad\r\n"), Failed);
        assert_eq!(first(b"set any 0 0 9\r\nuser tok2\r\n"), Failed);
        assert_eq!(first(b"set any 0 0 4\r\n tok\r\n"), BadFormat);
        assert_eq!(first(b"set any 0 0 3\r\ntok\r\n"), BadFormat);
        assert_eq!(first(b"add any 0 0 8\r\nuser tok\r\n"), NotAnAttempt);
        assert_eq!(first(b"get tok\r\n"), NotAnAttempt);
        assert_eq!(first(b"ms any 8\r\nuser tok\r\n"), NotAnAttempt);
    }

    #[test]
    fn token_comparison() {
        assert!(token_matches(b"s3cret", "s3cret"));
        assert!(!token_matches(b"s3cre", "s3cret"));
        assert!(!token_matches(b"s3creT", "s3cret"));
        assert!(!token_matches(b"", "s3cret"));
    }
}
