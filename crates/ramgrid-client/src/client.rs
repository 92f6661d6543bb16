//! The cluster client: its configuration, handle and shared request plumbing (refusal mapping,
//! frame budget). Beside it: the spec and partition maps in `topology.rs`, table and version admin
//! in `admin.rs`, connections in `exchange.rs`, the partition round of reads and operators in
//! `round.rs`, GET in `read.rs`, writes in `write.rs`, operators in `ops.rs`, scans in `scan.rs`.
//!
//! A batch's life (see [`Client::get_into`]):
//! 1. Keys are hashed to partitions ([`ramgrid_proto::cluster::partition_of`]) and grouped by
//!    partition (one counting sort).
//! 2. Each partition with keys is assigned a server: for reads the first replica that has not failed in
//!    this call and is up (slow or down servers are tried last, `health.rs`); for writes every replica.
//! 3. One frame per server is encoded straight into that connection's buffer and written; only then
//!    are the replies read, so every server works at the same time. Reads wait on all connections at
//!    once and send a late server's partitions to another replica too (`hedge.rs`).
//! 4. Reply values are scattered into the caller's output by key index (no per-key allocation).
//! 5. A server that fails (connect, I/O, timeout, garbage) is marked down and its partitions go to the
//!    next replica; a partition with no replica left is reported by number. Connections, retries and
//!    down-marking live in `exchange.rs`; every call is bounded by the call deadline (`deadline.rs`).
//! 6. A refusal for a stale epoch (WRONG_EPOCH, NOT_OWNER) fetches the spec from the refusing server,
//!    adopts it and retries the batch, a bounded number of times.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use ramgrid_proto::cluster::ClusterSpec;
use ramgrid_proto::native::{ErrorReply, Response, Status};

use crate::conn::{ConnSettings, Pool};
use crate::deadline::{self, CallScope};
use crate::error::{Error, Result};
use crate::health::Prober;
use crate::near::{NearCache, NearStats};
use crate::plan::{Ack, Consistency};
use crate::values::Values;

pub use crate::admin::{TableDescription, TableMeta, VersionSummary};
pub(crate) use crate::topology::{stale_backoff, Topology};

/// Largest request frame body the client builds before the servers told it their limit.
const DEFAULT_MAX_BODY: usize = 1 << 20;
/// Largest request frame body the client builds at all: bigger batches are cut into chunks, each a
/// full fan-out round, which bounds the memory a batch holds in flight.
pub(crate) const CHUNK_BODY: usize = 16 << 20;
/// Room left in a frame for its header, table name and per-group overhead.
const FRAME_SLACK: usize = 4096;

/// How a [`Client`] connects and behaves.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// The servers (`host:port`), in cluster-spec order.
    pub servers: Vec<String>,
    /// Auth token presented in HELLO.
    pub token: Option<String>,
    /// TLS to every server (servers started with `--tls-cert`); `None` for plain TCP.
    pub tls: Option<crate::tls::TlsConfig>,
    /// Limit for each request round trip (every round of a batch gets its own).
    pub timeout: Duration,
    /// Limit for a whole call, every round, failover and retry included: no call returns later
    /// than this (it fails with a Timeout instead). Calls of very many keys may need more.
    pub call_timeout: Duration,
    /// Limit for opening a connection: the TCP connect, and then the HELLO exchange.
    pub connect_timeout: Duration,
    /// Replicas that must acknowledge each written key.
    pub ack: Ack,
    /// What reads of open or current versions may return.
    pub consistency: Consistency,
    /// Near cache size in bytes for sealed versions read with a pinned version; 0 turns it off.
    pub near_cache_bytes: usize,
    /// Idle connections kept per server.
    pub pool_size: usize,
    /// How many times a batch refused for a stale spec is retried after a refresh.
    pub spec_retries: u32,
    /// Name sent in HELLO (shows in server logs).
    pub client_name: String,
}

impl ClientConfig {
    /// Defaults for `servers`: 5 s timeout, 30 s call timeout, 1 s connect timeout, ack all, no near
    /// cache, 4 pooled connections.
    pub fn new(servers: Vec<String>) -> ClientConfig {
        ClientConfig {
            servers,
            token: None,
            tls: None,
            timeout: Duration::from_secs(5),
            call_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(1),
            ack: Ack::All,
            consistency: Consistency::Linearizable,
            near_cache_bytes: 0,
            pool_size: 4,
            spec_retries: 6,
            client_name: format!("ramgrid-client/{}", env!("CARGO_PKG_VERSION")),
        }
    }
}

/// One server's `stats` as (name, value) pairs, in the server's order.
pub type ServerStats = Vec<(String, String)>;

/// The outcome of [`Client::get`]: values and found flags in key order, and the version read.
#[derive(Debug, Clone, PartialEq)]
pub struct GetResult {
    /// The values (zero / empty where not found).
    pub values: Values,
    /// Whether each key was found.
    pub found: Vec<bool>,
    /// The version every value was read from.
    pub version: u32,
}

/// A cluster client. Cheap to clone (clones share pools and caches); `Send + Sync`, and concurrent
/// callers use different pooled connections.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("servers", &self.servers())
            .field("epoch", &self.epoch())
            .finish()
    }
}

pub(crate) struct Inner {
    pub(crate) settings: ConnSettings,
    pub(crate) call_timeout: Duration,
    pub(crate) prober: Arc<Prober>,
    pub(crate) ack: Ack,
    pub(crate) consistency: Consistency,
    pub(crate) spec_retries: u32,
    pub(crate) topo: RwLock<Arc<Topology>>,
    pub(crate) pools: Mutex<HashMap<String, Arc<Pool>>>,
    pub(crate) tables: TableCache,
    pub(crate) near: Option<NearCache>,
    /// (table, version) -> None when known sealed, Some(when) when seen unsealed.
    pub(crate) sealed: Mutex<HashMap<(String, u32), Option<Instant>>>,
    /// Smallest HELLO max_body seen (0 until a server told).
    pub(crate) max_body: AtomicU64,
    /// Sealed versions mapped from servers on this host (shm.rs).
    pub(crate) shm: crate::shm::Registry,
}

/// What the client knows of each table, and a generation that every change of it bumps: a
/// shared-memory reader (shm_reader.rs) checks its table's incarnation only when the generation
/// moved, with one atomic load per read instead of a lock and a lookup by name.
#[derive(Default)]
pub(crate) struct TableCache {
    map: RwLock<HashMap<String, TableMeta>>,
    generation: AtomicU64,
}

impl TableCache {
    pub(crate) fn read(&self) -> parking_lot::RwLockReadGuard<'_, HashMap<String, TableMeta>> {
        self.map.read()
    }

    /// The map to change; the generation moves when the guard is dropped (before the lock is
    /// released, so a reader that sees the old generation saw the old map or the new one).
    pub(crate) fn write(&self) -> TableCacheWrite<'_> {
        TableCacheWrite {
            map: self.map.write(),
            generation: &self.generation,
        }
    }

    /// Moves on every change of the map.
    #[inline]
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }
}

/// A write guard of [`TableCache`] that moves its generation when dropped.
pub(crate) struct TableCacheWrite<'a> {
    map: parking_lot::RwLockWriteGuard<'a, HashMap<String, TableMeta>>,
    generation: &'a AtomicU64,
}

impl std::ops::Deref for TableCacheWrite<'_> {
    type Target = HashMap<String, TableMeta>;
    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

impl std::ops::DerefMut for TableCacheWrite<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.map
    }
}

impl Drop for TableCacheWrite<'_> {
    fn drop(&mut self) {
        self.generation.fetch_add(1, Ordering::Release);
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.prober.stop();
    }
}

/// Why a round stopped: a refusal that a spec refresh may cure, or anything else.
pub(crate) enum OpError {
    /// The server at this index refused the epoch or the partitions.
    Stale(usize, String),
    /// Give up with this error.
    Fatal(Error),
}

impl From<Error> for OpError {
    fn from(e: Error) -> OpError {
        OpError::Fatal(e)
    }
}

/// How one server's reply was taken.
pub(crate) enum Handled {
    Ok,
    /// The server failed this request (not the data): try another replica.
    Failed(Error),
    /// The server is fine but cannot serve `partitions` of the frame yet (REPAIRING: it is still
    /// copying them in): those go to another replica, the frame's other partitions back to it.
    Refused {
        /// The partitions it refused.
        partitions: Vec<u32>,
        /// Why, for the call's error if no replica serves them.
        error: Error,
    },
}

pub(crate) fn encode_err(e: ramgrid_proto::native::FrameError) -> Error {
    Error::InvalidArgument(format!("cannot encode request: {e}"))
}

/// Maps a refusal to an error; WRONG_EPOCH and NOT_OWNER become [`OpError::Stale`].
pub(crate) fn refusal(
    server: usize,
    addr: &str,
    table: &str,
    version: u32,
    e: ErrorReply,
) -> OpError {
    let s = || addr.to_string();
    let err = match e.status {
        Status::WrongEpoch | Status::NotOwner => {
            return OpError::Stale(server, format!("{addr}: {} {}", e.status.name(), e.message));
        }
        Status::NoSuchTable => Error::TableNotFound(table.to_string()),
        Status::TableExists => Error::TableExists(table.to_string()),
        Status::NoSuchVersion => Error::VersionNotFound {
            table: table.to_string(),
            version,
        },
        Status::VersionSealed => Error::VersionSealed {
            table: table.to_string(),
            version,
        },
        Status::VersionNotSealed => Error::VersionNotSealed {
            table: table.to_string(),
            version,
        },
        Status::AuthRequired | Status::AuthFailed => Error::Auth {
            server: s(),
            message: e.message,
        },
        Status::OutOfMemory => Error::OutOfMemory {
            server: s(),
            message: e.message,
        },
        Status::UnsupportedProtocol => Error::Protocol {
            server: s(),
            message: e.message,
        },
        Status::TooLarge => Error::TooLarge {
            server: s(),
            message: e.message,
        },
        Status::BadRequest
        | Status::Internal
        | Status::VersionExists
        | Status::Repairing
        | Status::NoQuorum
        | Status::Indeterminate
        | Status::Ok => {
            if e.status == Status::BadRequest {
                return OpError::Fatal(Error::InvalidArgument(format!(
                    "{addr} refused: {} {}",
                    e.status.name(),
                    e.message
                )));
            }
            Error::Server {
                server: s(),
                status: e.status.name(),
                message: e.message,
            }
        }
    };
    OpError::Fatal(err)
}

impl Client {
    /// A client for the servers in `config`. No connection is made until the first request.
    pub fn new(config: ClientConfig) -> Result<Client> {
        // The token goes in HELLO only, never into the spec text that push_spec sends and GET_SPEC
        // hands to any authenticated peer (it does not count in the epoch either).
        let spec = ClusterSpec::new(config.servers.clone(), None)
            .map_err(|e| Error::InvalidArgument(format!("bad server list: {e}")))?;
        let settings = ConnSettings {
            connect_timeout: config.connect_timeout,
            timeout: config.timeout,
            token: config.token,
            tls: match &config.tls {
                None => None,
                Some(t) => Some(crate::tls::ClientTls::load(t)?),
            },
            pool_size: config.pool_size,
            client_name: config.client_name,
        };
        let inner = Inner {
            settings,
            call_timeout: config.call_timeout,
            prober: Prober::new(),
            ack: config.ack,
            consistency: config.consistency,
            spec_retries: config.spec_retries,
            topo: RwLock::new(Arc::new(Topology {
                epoch: spec.epoch(),
                spec: spec.clone(),
                pools: Vec::new(),
                maps: Mutex::new(HashMap::new()),
            })),
            pools: Mutex::new(HashMap::new()),
            tables: TableCache::default(),
            near: (config.near_cache_bytes > 0).then(|| NearCache::new(config.near_cache_bytes)),
            sealed: Mutex::new(HashMap::new()),
            max_body: AtomicU64::new(0),
            shm: Default::default(),
        };
        let client = Client {
            inner: Arc::new(inner),
        };
        client.adopt(spec);
        Ok(client)
    }

    // ------------------------------------------------------------------------------------------
    // Spec and topology

    /// Marks a public call: the outermost one on this thread sets the call's deadline.
    pub(crate) fn call(&self) -> CallScope {
        CallScope::enter(self.inner.call_timeout)
    }

    // ------------------------------------------------------------------------------------------
    // Frame budget

    pub(crate) fn max_body(&self) -> usize {
        match self.inner.max_body.load(Ordering::Relaxed) {
            0 => DEFAULT_MAX_BODY,
            n => (n as usize).min(CHUNK_BODY),
        }
    }

    /// Cuts `idx` into runs whose frames fit the servers' body limit even if every key went to one server.
    pub(crate) fn chunks<'i>(
        &self,
        idx: &'i [u32],
        cost: impl Fn(usize) -> usize,
    ) -> Vec<&'i [u32]> {
        let budget = self.max_body().saturating_sub(FRAME_SLACK).max(1024);
        let mut out = Vec::new();
        let (mut start, mut used) = (0, 0usize);
        for (j, &i) in idx.iter().enumerate() {
            let c = cost(i as usize) + 8; // + the key's share of a group header, generously
            if used + c > budget && j > start {
                out.push(&idx[start..j]);
                start = j;
                used = 0;
            }
            used += c;
        }
        if start < idx.len() {
            out.push(&idx[start..]);
        }
        out
    }

    // ------------------------------------------------------------------------------------------
    // Observability

    /// Near-cache counters (all zero when it is off).
    pub fn near_stats(&self) -> NearStats {
        self.inner
            .near
            .as_ref()
            .map(NearCache::stats)
            .unwrap_or_default()
    }

    /// Each server's memcached-protocol `stats` (name, value pairs), in spec order; `Err` entries for
    /// servers that did not answer.
    pub fn server_stats(&self) -> Vec<(String, Result<ServerStats>)> {
        let _call = self.call();
        let topo = self.topology();
        let settings = &self.inner.settings;
        topo.spec
            .servers()
            .iter()
            .map(|addr| {
                let left =
                    deadline::after(settings.timeout).saturating_duration_since(Instant::now());
                let stats = if left.is_zero() {
                    Err(deadline::timeout_error(addr))
                } else {
                    crate::stats::fetch(
                        addr,
                        settings.connect_timeout.min(left),
                        left,
                        settings.tls.as_ref(),
                        settings.token.as_deref(),
                    )
                };
                (addr.clone(), stats)
            })
            .collect()
    }

    /// Closes every idle connection (in-flight calls finish normally; later calls reconnect).
    pub fn close(&self) {
        for p in self.inner.pools.lock().values() {
            p.clear();
        }
    }
}

pub(crate) fn unexpected(addr: &str, resp: &Response<'_>) -> Error {
    let what = match resp {
        Response::Error(e) => format!("{} {}", e.status.name(), e.message),
        other => format!("{other:?}").chars().take(80).collect(),
    };
    Error::Protocol {
        server: addr.to_string(),
        message: format!("unexpected reply: {what}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_respect_the_body_budget() {
        let c = Client::new(ClientConfig::new(vec!["127.0.0.1:1".into()])).unwrap();
        let idx: Vec<u32> = (0..10_000).collect();
        let chunks = c.chunks(&idx, |_| 1000);
        assert!(chunks.len() > 1);
        assert_eq!(chunks.iter().map(|c| c.len()).sum::<usize>(), 10_000);
        assert!(chunks.iter().all(|c| c.len() * 1008 <= DEFAULT_MAX_BODY));
        // A single key bigger than the budget still goes, alone.
        let big = c.chunks(&idx[..3], |_| 10 * DEFAULT_MAX_BODY);
        assert_eq!(big.len(), 3);
    }
}
