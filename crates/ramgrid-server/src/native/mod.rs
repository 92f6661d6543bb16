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
//! (GET, PUT, DELETE), `ops.rs` (OPERATOR: operators run at the data, exact or refused), `scan.rs` (SCAN: pages of a
//! plain or filtered scan, one moment per partition);
//! `checks.rs` holds the refusals every data request makes before it touches a key, `convert.rs`
//! the mapping between the store's types and the wire's.

use std::sync::Arc;

use parking_lot::RwLock;
use ramgrid_proto::cluster::ClusterSpec;
use ramgrid_proto::native::{ErrorReply, HEADER_LEN};
use ramgrid_store::tables::{TableVersion, Tables};

use crate::wal::Log;

mod checks;
mod cluster;
mod conn;
mod convert;
mod data;
mod handler;
mod ops;
mod scan;
mod tables;

pub use crate::cluster::{held_partitions, ClusterState};
pub use conn::serve;
use convert::disk_refusal;
pub(crate) use convert::{refusal, store_value_type};
pub(crate) use data::value_ref;
#[doc(hidden)]
pub use ops::{AfterPass, AFTER_PASS as OPERATOR_AFTER_PASS_HOOK};

/// Everything the native protocol needs that the memcached side does not.
pub struct NativeState {
    /// The versioned tables.
    pub tables: Tables,
    /// The installed spec; `None` until `--cluster-spec` or SET_SPEC (then this server holds every partition).
    pub cluster: RwLock<Option<ClusterState>>,
    /// Token clients must present in HELLO.
    pub token: Option<String>,
    /// TLS (`--tls-cert`): also how this server connects to its peers.
    pub tls: Option<Arc<crate::tls::Tls>>,
    /// This server's identity: its address as the spec lists it.
    pub server_id: String,
    /// Largest request body accepted.
    pub max_body: usize,
    /// The data directory (`--data-dir`), where snapshot tables are kept.
    pub persist: Option<crate::persist::Persist>,
    /// The repair thread's state (repair.rs).
    pub repair: crate::repair::RepairState,
    /// Partition images being copied out to peers (export.rs).
    pub exports: crate::export::Exports,
    /// This server's member of the metadata group (meta/mod.rs), once started.
    pub meta: std::sync::OnceLock<Arc<crate::meta::Meta>>,
    /// Where METRICS finds the server-wide counters (metrics.rs).
    pub metrics: crate::metrics::Hook,
}

impl NativeState {
    /// Rewrite a table's catalog in the data directory, if there is one and the table is durable.
    pub(crate) fn sync_catalog(&self, name: &str) -> Result<(), ErrorReply> {
        match &self.persist {
            Some(p) => p.sync_table(&self.tables, name).map_err(disk_refusal),
            None => Ok(()),
        }
    }

    /// Installs `spec` (from `--cluster-spec`, SET_SPEC or a peer): see `cluster.rs`.
    pub fn install_spec(&self, spec: ClusterSpec) -> Result<u64, String> {
        crate::cluster::install_spec(self, spec)
    }

    /// NO_QUORUM while this server is cut off from the metadata group (meta/mod.rs).
    pub fn check_quorum(&self) -> Result<(), ErrorReply> {
        match self.meta.get() {
            Some(m) => m.check_quorum(),
            None => Ok(()),
        }
    }

    fn epoch(&self) -> u64 {
        self.cluster.read().as_ref().map_or(0, |c| c.epoch)
    }

    /// The write-ahead log a write to `tv` must go through (log tables on a server with a data
    /// directory); a failed log refuses the write before anything is applied.
    fn log_of(&self, tv: &TableVersion) -> Result<Option<Arc<Log>>, ErrorReply> {
        match &self.persist {
            Some(p) => p.log_of(tv).map_err(disk_refusal),
            None => Ok(None),
        }
    }
}
/// Bytes of the frame header, re-exported for the connection's protocol sniffing.
pub const FRAME_HEADER_LEN: usize = HEADER_LEN;
