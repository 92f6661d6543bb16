//! The client's one error type. Per-key outcomes of a batch (a miss, a refused key) are values in
//! the results; `Err` means the call as a whole could not be carried out as asked.

use std::fmt;
use std::time::Duration;

/// Why a client call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The caller passed something unusable (bad address, key, value shape, acknowledgement name...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A server refused a request as too large (TOO_LARGE): its frame, or for a GET the values
    /// it would return, pass the server's body limit. Reads split such a batch and retry by
    /// themselves; this only surfaces when a single key is too much.
    #[error("{server} refused the request as too large: {message}")]
    TooLarge {
        /// `host:port` of the server.
        server: String,
        /// The server's reason.
        message: String,
    },
    /// No connection could be made to a server.
    #[error("cannot connect to {server}: {source}")]
    Connect {
        /// `host:port` of the server.
        server: String,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },
    /// A server did not answer within the request timeout.
    #[error("timed out waiting for {server}")]
    Timeout {
        /// `host:port` of the server.
        server: String,
    },
    /// The call as a whole ran past [`crate::ClientConfig::call_timeout`]; what it was waiting for
    /// then is named. Not a verdict on that server (it is not marked down for it).
    #[error("call timed out after {limit:?} (the client's call timeout), waiting for {server}")]
    CallTimeout {
        /// `host:port` of the server waited for when time ran out (empty between requests).
        server: String,
        /// The call timeout.
        limit: Duration,
    },
    /// The server turned the connection away before any exchange: it answered with a line of text
    /// instead of a native frame (a server at its `--max-conns` says
    /// `SERVER_ERROR too many open connections`, as memcached does) and closed.
    #[error("{server} refused the connection: {message}")]
    Refused {
        /// `host:port` of the server.
        server: String,
        /// The server's line, e.g. `SERVER_ERROR too many open connections`.
        message: String,
    },
    /// A connection broke while a request was in flight.
    #[error("connection to {server} failed: {source}")]
    Io {
        /// `host:port` of the server.
        server: String,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },
    /// The server refused the token (or wants one and none was given).
    #[error("authentication refused by {server}: {message}")]
    Auth {
        /// `host:port` of the server.
        server: String,
        /// The server's reason.
        message: String,
    },
    /// The peer sent something this client cannot parse, or answered out of protocol.
    #[error("protocol error from {server}: {message}")]
    Protocol {
        /// `host:port` of the server.
        server: String,
        /// What was wrong.
        message: String,
    },
    /// No table of that name.
    #[error("no such table: {0}")]
    TableNotFound(String),
    /// A table of that name exists already.
    #[error("table exists: {0}")]
    TableExists(String),
    /// The table has no such version (version 0: no current version).
    #[error("table {table} has no version {version}")]
    VersionNotFound {
        /// Table name.
        table: String,
        /// The version asked for.
        version: u32,
    },
    /// The version is sealed and cannot be written.
    #[error("version {version} of table {table} is sealed")]
    VersionSealed {
        /// Table name.
        table: String,
        /// The version written to.
        version: u32,
    },
    /// A version cannot be made current because it is not sealed.
    #[error("version {version} of table {table} is not sealed")]
    VersionNotSealed {
        /// Table name.
        table: String,
        /// The version.
        version: u32,
    },
    /// A server is out of memory for the request.
    #[error("{server} is out of memory: {message}")]
    OutOfMemory {
        /// `host:port` of the server.
        server: String,
        /// The server's detail.
        message: String,
    },
    /// No replica of these partitions answered: their keys could not be read or written.
    #[error("partitions unavailable (no replica answered): {partitions:?}; {detail}")]
    PartitionsUnavailable {
        /// The partitions none of whose replicas answered, ascending.
        partitions: Vec<u32>,
        /// The failures seen, one per server.
        detail: String,
    },
    /// Some keys of a write were refused or not acknowledged by enough replicas; the others were stored.
    #[error("{} of the batch's keys failed: {}", failures.len(), summarize(failures))]
    Batch {
        /// (index in the batch, reason) for each failed key, ascending by index.
        failures: Vec<(usize, String)>,
    },
    /// The servers kept refusing the request under the spec this client fetched from them.
    #[error("cluster spec kept changing: {0}")]
    StaleSpec(String),
    /// A move (adding or removing servers) did not happen, or was undone: the cluster runs the
    /// spec it ran before. Not the caller's fault: retry once the servers named answer.
    #[error("{message}")]
    MoveFailed {
        /// What happened.
        message: String,
        /// A member of the cluster did not answer (down, and not failed over yet).
        member_down: bool,
    },
    /// Any other refusal from a server.
    #[error("{server} refused the request ({status}): {message}")]
    Server {
        /// `host:port` of the server.
        server: String,
        /// The wire status name.
        status: &'static str,
        /// The server's detail.
        message: String,
    },
}

fn summarize(failures: &[(usize, String)]) -> impl fmt::Display + '_ {
    struct S<'a>(&'a [(usize, String)]);
    impl fmt::Display for S<'_> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            for (n, (i, why)) in self.0.iter().take(3).enumerate() {
                if n > 0 {
                    f.write_str("; ")?;
                }
                write!(f, "key {i}: {why}")?;
            }
            if self.0.len() > 3 {
                write!(f, "; ...")?;
            }
            Ok(())
        }
    }
    S(failures)
}

/// A stable classification of [`Error`] (what the Python binding maps to exception classes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// [`Error::InvalidArgument`] and [`Error::TooLarge`].
    InvalidArgument,
    /// [`Error::Connect`] and [`Error::Io`].
    ConnectionFailed,
    /// [`Error::Timeout`] and [`Error::CallTimeout`].
    Timeout,
    /// [`Error::Refused`].
    Refused,
    /// [`Error::Auth`].
    Auth,
    /// [`Error::Protocol`].
    Protocol,
    /// [`Error::TableNotFound`].
    TableNotFound,
    /// [`Error::TableExists`].
    TableExists,
    /// [`Error::VersionNotFound`].
    VersionNotFound,
    /// [`Error::VersionSealed`].
    VersionSealed,
    /// [`Error::VersionNotSealed`].
    VersionNotSealed,
    /// [`Error::OutOfMemory`].
    OutOfMemory,
    /// [`Error::PartitionsUnavailable`].
    PartitionsUnavailable,
    /// [`Error::Batch`].
    Batch,
    /// [`Error::StaleSpec`].
    StaleSpec,
    /// [`Error::MoveFailed`].
    MoveFailed,
    /// [`Error::Server`].
    Server,
}

impl ErrorKind {
    /// Every kind (the binding's test that each maps to a Python exception class iterates these).
    pub const ALL: [ErrorKind; 17] = [
        ErrorKind::InvalidArgument,
        ErrorKind::ConnectionFailed,
        ErrorKind::Timeout,
        ErrorKind::Refused,
        ErrorKind::Auth,
        ErrorKind::Protocol,
        ErrorKind::TableNotFound,
        ErrorKind::TableExists,
        ErrorKind::VersionNotFound,
        ErrorKind::VersionSealed,
        ErrorKind::VersionNotSealed,
        ErrorKind::OutOfMemory,
        ErrorKind::PartitionsUnavailable,
        ErrorKind::Batch,
        ErrorKind::StaleSpec,
        ErrorKind::MoveFailed,
        ErrorKind::Server,
    ];
}

impl Error {
    /// The kind of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidArgument(_) | Error::TooLarge { .. } => ErrorKind::InvalidArgument,
            Error::Connect { .. } | Error::Io { .. } => ErrorKind::ConnectionFailed,
            Error::Timeout { .. } | Error::CallTimeout { .. } => ErrorKind::Timeout,
            Error::Refused { .. } => ErrorKind::Refused,
            Error::Auth { .. } => ErrorKind::Auth,
            Error::Protocol { .. } => ErrorKind::Protocol,
            Error::TableNotFound(_) => ErrorKind::TableNotFound,
            Error::TableExists(_) => ErrorKind::TableExists,
            Error::VersionNotFound { .. } => ErrorKind::VersionNotFound,
            Error::VersionSealed { .. } => ErrorKind::VersionSealed,
            Error::VersionNotSealed { .. } => ErrorKind::VersionNotSealed,
            Error::OutOfMemory { .. } => ErrorKind::OutOfMemory,
            Error::PartitionsUnavailable { .. } => ErrorKind::PartitionsUnavailable,
            Error::Batch { .. } => ErrorKind::Batch,
            Error::StaleSpec(_) => ErrorKind::StaleSpec,
            Error::MoveFailed { .. } => ErrorKind::MoveFailed,
            Error::Server { .. } => ErrorKind::Server,
        }
    }

    /// Whether the failure is the server's or the network's (another replica may succeed), as opposed
    /// to an answer about the data or the request itself. A refused connection is the server's (it
    /// is full); the call timeout is not (the call ran out of time, whoever it was waiting for).
    pub(crate) fn is_transport(&self) -> bool {
        matches!(
            self,
            Error::Connect { .. }
                | Error::Io { .. }
                | Error::Timeout { .. }
                | Error::Protocol { .. }
                | Error::Refused { .. }
        )
    }
}

/// Result alias for client calls.
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_error_message_names_first_failures() {
        let e = Error::Batch {
            failures: (0..5)
                .map(|i| (i * 2, "VALUE_TOO_LARGE".to_string()))
                .collect(),
        };
        let s = e.to_string();
        assert!(
            s.starts_with("5 of the batch's keys failed: key 0: VALUE_TOO_LARGE; key 2"),
            "{s}"
        );
        assert!(s.ends_with("; ..."), "{s}");
        assert_eq!(e.kind(), ErrorKind::Batch);
    }

    #[test]
    fn all_lists_every_kind_once() {
        // An exhaustive match (inside this crate `#[non_exhaustive]` does not apply): a new kind
        // fails to compile here until it is given a place in `ALL`.
        let position = |k: ErrorKind| match k {
            ErrorKind::InvalidArgument => 0,
            ErrorKind::ConnectionFailed => 1,
            ErrorKind::Timeout => 2,
            ErrorKind::Refused => 3,
            ErrorKind::Auth => 4,
            ErrorKind::Protocol => 5,
            ErrorKind::TableNotFound => 6,
            ErrorKind::TableExists => 7,
            ErrorKind::VersionNotFound => 8,
            ErrorKind::VersionSealed => 9,
            ErrorKind::VersionNotSealed => 10,
            ErrorKind::OutOfMemory => 11,
            ErrorKind::PartitionsUnavailable => 12,
            ErrorKind::Batch => 13,
            ErrorKind::StaleSpec => 14,
            ErrorKind::MoveFailed => 15,
            ErrorKind::Server => 16,
        };
        for (i, &k) in ErrorKind::ALL.iter().enumerate() {
            assert_eq!(position(k), i, "{k:?}");
        }
    }
}
