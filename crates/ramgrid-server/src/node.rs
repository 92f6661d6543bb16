//! The node: everything one server holds, whatever protocol reaches it. State only; each
//! behaviour lives in the module that owns it (`cluster.rs` installs specs and derives partition
//! states, `persist.rs` keeps durable tables, `repair.rs` copies partitions in, `export.rs` copies
//! them out, `meta/` is the node's member of the metadata group, `metrics.rs` renders its
//! counters) and the protocols (`native/`, `memcache/`) only adapt requests to it, the way
//! mini-redis keeps its `Db` apart from its commands.

use std::sync::{Arc, OnceLock};

use parking_lot::RwLock;
use ramgrid_store::tables::Tables;

use crate::cluster::ClusterState;

/// One server's state: its tables, the cluster map it runs, and the subsystems that keep them.
pub struct Node {
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
    /// The data directory (`--data-dir`), where durable tables are kept (persist.rs).
    pub persist: Option<crate::persist::Persist>,
    /// The repair thread's state (repair.rs).
    pub repair: crate::repair::RepairState,
    /// Partition images being copied out to peers (export.rs).
    pub exports: crate::export::Exports,
    /// This server's member of the metadata group (meta/mod.rs), once started.
    pub meta: OnceLock<Arc<crate::meta::Meta>>,
    /// Where METRICS finds the server-wide counters (metrics.rs).
    pub metrics: crate::metrics::Hook,
    /// The partitions' order locks and the forwarding of writes to backups (replicate.rs).
    pub replication: crate::replicate::Replication,
    /// What this server's replica checks found (`replica_check.rs`).
    pub replica_checks: crate::replica_check::CheckStats,
}
