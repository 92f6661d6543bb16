//! Cluster metadata as a replicated state machine: a Raft group (openraft) whose committed
//! commands every member applies in the same order (issue 16's foundation).
//!
//! # Why openraft
//!
//! Consensus is not written here. openraft is maintained, async on tokio (what the server runs
//! on), in production use (Databend's meta service among others), and has what a cluster of
//! servers needs: learners that receive the log without voting, membership changes through
//! joint consensus, snapshots with log purging, and a read index for linearizable reads. The
//! `raft` crate (TiKV's) is as solid but leaves the event loop, timers and transport to the
//! caller; here openraft drives them and this crate supplies storage and a transport.
//!
//! # What is replicated
//!
//! [`MetaState`]: the group's members, the serving spec (ordered servers; its epoch is
//! `ramgrid_proto::cluster::epoch_of`, 0 while empty), a rebalance in progress, the servers
//! marked down, and the table catalog (incarnation, opaque spec, version high-water mark,
//! current version). It changes only by [`MetaCommand`]s, each applied whole or refused whole
//! ([`MetaRefusal`], state unchanged):
//!
//! 1. `SetServers` replaces the spec, compare-and-set on the epoch when `expect_epoch` is given;
//!    refused while a transition runs.
//! 2. `BeginTransition` records a rebalance (idempotent for the same target, refused for another
//!    while one runs); `CompleteTransition` makes its target the spec (only that transition);
//!    `AbortTransition` forgets it (idempotent).
//! 3. `MarkDown` / `MarkUp` record the failure detector's verdicts (for servers the cluster
//!    names); marks of servers leaving the spec are dropped.
//! 4. `CreateTable`: of two creators of one name, the first committed wins; the other gets
//!    `TableExists` naming the winner's incarnation. The same incarnation again is a no-op, so a
//!    creator may retry. `DropTable`, `RaiseHighWater` and `SetCurrent` name the incarnation they
//!    mean and are refused for another (`WrongIncarnation`), so a stale client never changes a
//!    table created again under the name. The high-water mark only rises (a version number is
//!    never reused) and the current version is always one that was created.
//!
//! # Proposals and reads
//!
//! [`MetaNode::propose`] works on any node: a follower forwards to the leader over the
//! transport. The leader first confirms with a heartbeat round that it still leads a majority,
//! and only then appends; so `NoQuorum` (no such leader within `propose_timeout_ms`, 5 s by
//! default) means the command was never appended and will never be applied, and a minority
//! never commits anything (Raft). `Indeterminate` means it was appended but its commit was not
//! seen in time (the leader lost its majority just then, or a forwarded reply was lost): read the
//! state to know. [`MetaNode::state`] is this node's applied state (immediate, maybe behind);
//! [`MetaNode::linearizable_state`] reads at the leader's commit index; [`MetaNode::watch`] sees
//! every applied state.
//!
//! # Timeouts and the re-election bound
//!
//! Defaults for a noisy shared machine: heartbeat 100 ms, election timeout random in
//! 600..1200 ms. A follower stands for election when it has heard no leader for its timeout, so
//! after a leader dies a candidate appears within 1.2 s and wins after one vote round (one RPC
//! timeout at most, here about a heartbeat); a split vote costs another random timeout. The
//! expected bound is about 1.5 s, 2.5 s with one split vote; the test of leader loss measures it
//! on this machine and fails above 6 s. Every RPC has a timeout (openraft's per-RPC TTL, enforced
//! by the transport, connect included), so a dead or hung peer costs a timeout, never a hang.
//!
//! # Durability
//!
//! With a directory ([`MetaConfig::dir`]): the log (`raft.log`, append-only, each record
//! length-checked and xxh3-checksummed) is fsynced before openraft is told an append is done, so
//! nothing acknowledged to a leader is lost by a crash; the vote (`raft.vote`) and the snapshot
//! (`raft.snapshot`) are replaced atomically (temporary file, fsync, rename, directory fsync).
//! On open, a torn record at the end of the log (a crash mid-append, never acknowledged) is cut;
//! damage anywhere else is an error naming the file, never skipped. The log is purged up to each
//! snapshot (every `snapshot_every` entries, keeping `keep_logs`). A restarted node starts from
//! its snapshot and re-applies its log once it learns the commit index from a leader, so
//! [`MetaNode::state`] may lag until a leader is elected.
//!
//! Without a directory everything is in memory: a node restarted empty rejoins and is refilled
//! by the leader (log or snapshot) as long as a majority kept running, but if the whole group
//! stops, the metadata is gone: the servers must be initialised again as a new group and the
//! spec and catalog pushed again.
//!
//! # Wire
//!
//! RPCs are JSON in length-prefixed frames ([`network`]). JSON rather than bincode because some
//! of openraft's serde types skip fields conditionally, which only self-describing formats
//! decode, and because metadata traffic is small and rare; the cost is snapshots sent as JSON
//! arrays of numbers (about 3.5 bytes per byte), acceptable for a catalog.

#![warn(missing_docs)]

mod disk;
mod error;
mod log;
pub mod network;
mod node;
mod sm;
pub mod state;

pub use error::{ErrorKind, MetaError, ProposeError};
pub use log::{LogStore, LOG_FILE, VOTE_FILE};
pub use network::{serve_tcp, TcpTransport, Transport, TransportError};
pub use node::{MetaConfig, MetaNode, MetaStatus};
pub use sm::{StateMachineStore, SNAPSHOT_FILE};
pub use state::{Member, MetaCommand, MetaRefusal, MetaReply, MetaState, NodeId, TableMeta, Transition};

openraft::declare_raft_types!(
    /// The openraft type configuration of the metadata group.
    pub TypeConfig:
        D = MetaCommand,
        R = Result<MetaReply, MetaRefusal>,
        NodeId = NodeId,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = std::io::Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);
