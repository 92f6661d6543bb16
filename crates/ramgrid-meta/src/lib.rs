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
//! 600..1200 ms (`election_timeout_min_ms..election_timeout_max_ms`). openraft 0.9 adds a leader
//! lease: a follower that heard from a leader refuses to vote for `election_timeout_max` after
//! that, and stands for election only when `election_timeout_max` + its random timeout have
//! passed without a leader (checked on a tick of 1.5 heartbeats). So after a leader dies, a new
//! one is elected within 2 x 1200 + 150 ms plus one vote round, about **2.6 s**, and not before
//! 1.8 s; a split vote (two candidates at once) adds up to one more election timeout, 1.2 s.
//! Measured on the 2-core development machine: 1.95 to 2.27 s over 14 runs (the leader-loss
//! test prints it, and fails above 4 s: the bound plus a split vote plus scheduling noise).
//! `propose_timeout_ms` (5 s) is above that bound, so a proposal made while a leader dies waits
//! for the next one instead of failing. Every RPC has a timeout (openraft's per-RPC TTL, enforced
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
//! # Seams for the server, and what is not done yet
//!
//! The server embeds a node with [`MetaNode::start_with`] (`ramgrid-server/src/meta/`), carrying
//! RPCs over its own native port (the RAFT opcode) with a pooled [`Transport`] and handing
//! incoming ones to [`MetaNode::handle_rpc`]. Every request names the node it is meant for, so a
//! process that answers at a member's address under another id refuses it. Known limits:
//!
//! 1. File I/O (appends with their fsync, snapshot writes) runs on the calling tokio worker
//!    (under `block_in_place` on a multi-threaded runtime, so other tasks move off it), not on
//!    a dedicated I/O thread; appends are not batched across proposals beyond what openraft
//!    hands over at once.
//! 2. [`TcpTransport`] (the stand-alone transport, for tests) opens a connection per RPC.
//! 3. The commit index is not persisted, so a restarted node shows its snapshot's state until a
//!    leader tells it what is committed (one heartbeat once a leader exists).
//! 4. A node dropped without [`MetaNode::shutdown`] keeps its Raft task running.
//! 5. `NoQuorum` is exact for a leader that has lost its majority before the proposal; a leader
//!    that loses it between the check and the commit answers `Indeterminate` instead.
//!
//! # Wire
//!
//! RPCs are JSON in length-prefixed frames ([`network`]), as are log records, the vote and the
//! snapshot. JSON rather than bincode: it is self-describing, so a frame or a log record can be
//! read when debugging and a change in openraft's types fails to decode with the field named
//! instead of misreading bytes; `serde_json` is already in the tree, where bincode would be one
//! more format dependency; and metadata traffic is small and rare (a heartbeat is a few hundred
//! bytes). The cost is size: snapshot bytes travel as JSON arrays of numbers (about 3.5 bytes
//! per byte), acceptable for a catalog of kilobytes to a few megabytes.

#![warn(missing_docs)]

mod disk;
mod error;
mod log;
pub mod network;
mod node;
mod sm;
pub mod state;
#[cfg(test)]
mod storage_tests;

pub use error::{ErrorKind, MetaError, ProposeError};
pub use log::{LogStore, COMMITTED_FILE, LOG_FILE, VOTE_FILE};
pub use network::{serve_tcp, TcpTransport, Transport, TransportError};
pub use node::{MetaConfig, MetaNode, MetaStatus};
pub use sm::{StateMachineStore, SNAPSHOT_FILE};
pub use state::{
    Member, MetaCommand, MetaRefusal, MetaReply, MetaState, NodeId, TableMeta, Transition,
};

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

/// The decoders a restart runs on the files of a durable directory, for the fuzz target
/// `meta_disk` (fuzz.rs). Not an API: compiled for tests and with the `fuzzing` feature only.
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzz;
