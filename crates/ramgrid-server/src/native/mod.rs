//! The native batch protocol on the server side: a connection whose first byte is the native magic
//! is served here, frame by frame, against the versioned tables (spec: docs/protocol-native.md).
//!
//! Invariants relied on:
//! 1. With a token configured, nothing but HELLO and PING is answered before a HELLO with the right
//!    token, and no data is touched.
//! 2. A data request is checked whole (epoch, every group's partition ownership, table, version)
//!    before any key is read or written: a refused request did nothing.
//! 3. A GET frame reads ONE version: the first group resolves "current" and every later group reads
//!    that same number, so a switch that lands mid-frame cannot mix versions in one reply.
//! 4. A frame that does not parse closes the connection; the server and other connections go on.
//!
//! Layout: `conn.rs` is the connection loop (frames in, replies out, buffer budget), `handler.rs`
//! the per-connection state and the dispatch of one request, then one file per family of requests:
//! `tables.rs` (catalog and versions), `cluster.rs` (spec, status, export, metrics), `data.rs`
//! (GET, PUT, DELETE), `primary.rs` (a client's PUT or DELETE taken by the partitions' primary,
//! forwarded to the other replicas in one order: `crate::replicate`), `backup.rs` (a primary's
//! forward, applied once), `ops.rs` (OPERATOR: operators run at the data, exact or refused), `scan.rs` (SCAN: pages of a
//! plain or filtered scan, one moment per partition);
//! `digest.rs` (DIGEST: what a server holds of some partitions, to compare replicas);
//! `checks.rs` holds the refusals every data request makes before it touches a key. The state
//! served is the node's (`crate::node::Node`); the mapping between the store's types and the
//! wire's is `crate::convert`.

use ramgrid_proto::native::HEADER_LEN;

mod backup;
mod checks;
mod cluster;
mod conn;
mod data;
pub(crate) mod digest;
mod handler;
mod ops;
mod primary;
mod scan;
mod tables;

pub use conn::serve;
#[doc(hidden)]
pub use ops::{AfterPass, AFTER_PASS as OPERATOR_AFTER_PASS_HOOK};

/// Bytes of the frame header, re-exported for the connection's protocol sniffing.
pub const FRAME_HEADER_LEN: usize = HEADER_LEN;
