//! The crate's one error type.

use serde::{Deserialize, Serialize};

use crate::state::MetaRefusal;

/// What went wrong with a metadata operation. It crosses the wire when a follower forwards a
/// proposal to the leader, so it carries strings rather than sources.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[non_exhaustive]
pub enum MetaError {
    /// The command committed and was refused by the state machine; the state is unchanged.
    #[error("refused: {0}")]
    Refused(MetaRefusal),
    /// No leader with a quorum answered within the timeout. The proposal was never appended to
    /// a leader's log, so it will never be applied.
    #[error("no quorum: no leader with a majority answered within {waited_ms} ms")]
    NoQuorum {
        /// How long the caller waited.
        waited_ms: u64,
    },
    /// The proposal reached a leader's log but its commit was not seen within the timeout (the
    /// leader lost its quorum, or the reply was lost): it may or may not be applied later.
    /// Read the state to find out; the idempotent commands may simply be proposed again.
    #[error("outcome unknown: {reason}")]
    Indeterminate {
        /// What cut the wait short.
        reason: String,
    },
    /// A membership change refused by Raft (another change in progress, an unknown learner).
    #[error("membership change refused: {0}")]
    Membership(String),
    /// Only inside forwarding: the node asked to lead a proposal is not the leader (any more).
    #[error("not the leader")]
    NotLeader,
    /// The durable state could not be read or written.
    #[error("storage: {0}")]
    Storage(String),
    /// A network or protocol fault outside Raft's own retries (binding the listener, a
    /// malformed RPC).
    #[error("network: {0}")]
    Network(String),
    /// The node is shut down (or its Raft task stopped after a fatal error).
    #[error("the meta node is shut down: {0}")]
    Shutdown(String),
}

/// `propose` and the other writes fail with this.
pub type ProposeError = MetaError;

/// The kind of a [`MetaError`], for callers that branch on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// [`MetaError::Refused`].
    Refused,
    /// [`MetaError::NoQuorum`].
    NoQuorum,
    /// [`MetaError::Indeterminate`].
    Indeterminate,
    /// [`MetaError::Membership`].
    Membership,
    /// [`MetaError::NotLeader`].
    NotLeader,
    /// [`MetaError::Storage`].
    Storage,
    /// [`MetaError::Network`].
    Network,
    /// [`MetaError::Shutdown`].
    Shutdown,
}

impl MetaError {
    /// Its kind.
    pub fn kind(&self) -> ErrorKind {
        match self {
            MetaError::Refused(_) => ErrorKind::Refused,
            MetaError::NoQuorum { .. } => ErrorKind::NoQuorum,
            MetaError::Indeterminate { .. } => ErrorKind::Indeterminate,
            MetaError::Membership(_) => ErrorKind::Membership,
            MetaError::NotLeader => ErrorKind::NotLeader,
            MetaError::Storage(_) => ErrorKind::Storage,
            MetaError::Network(_) => ErrorKind::Network,
            MetaError::Shutdown(_) => ErrorKind::Shutdown,
        }
    }
}
