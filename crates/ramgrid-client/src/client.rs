//! The cluster client: routing batches by partition and owner, fan-out to every server at once,
//! replica failover for reads, acknowledged replication for writes, spec refresh on stale epochs,
//! version-consistent reads and table/version admin.
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
use ramgrid_proto::cluster::{ClusterSpec, PartitionMap};
use ramgrid_proto::native::{
    CreateTable, Durability, ErrorReply, Request, Response, Status, TableInfo, ValueType,
    VersionRef,
};

use crate::conn::{ConnSettings, Pool};
use crate::deadline::{self, CallScope};
use crate::error::{Error, Result};
use crate::health::Prober;
use crate::near::{NearCache, NearStats};
use crate::plan::Ack;
use crate::values::Values;

/// Largest request frame body the client builds before the servers told it their limit.
const DEFAULT_MAX_BODY: usize = 1 << 20;
/// Largest request frame body the client builds at all: bigger batches are cut into chunks, each a
/// full fan-out round, which bounds the memory a batch holds in flight.
pub(crate) const CHUNK_BODY: usize = 16 << 20;
/// Room left in a frame for its header, table name and per-group overhead.
const FRAME_SLACK: usize = 4096;
/// How long "version V of T is not sealed" is believed before the near cache asks again.
const UNSEALED_RECHECK: Duration = Duration::from_secs(1);
/// Attempts at CREATE_VERSION when another client takes the same number at the same time.
const CREATE_VERSION_TRIES: u32 = 8;

/// How a [`Client`] connects and behaves.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// The servers (`host:port`), in cluster-spec order.
    pub servers: Vec<String>,
    /// Auth token presented in HELLO.
    pub token: Option<String>,
    /// Limit for each request round trip (every round of a batch gets its own).
    pub timeout: Duration,
    /// Limit for a whole call, every round, failover and retry included: no call returns later
    /// than this (it fails with a Timeout instead). Calls of very many keys may need more.
    pub call_timeout: Duration,
    /// Limit for opening a connection: the TCP connect, and then the HELLO exchange.
    pub connect_timeout: Duration,
    /// Replicas that must acknowledge each written key.
    pub ack: Ack,
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
            timeout: Duration::from_secs(5),
            call_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(1),
            ack: Ack::All,
            near_cache_bytes: 0,
            pool_size: 4,
            spec_retries: 6,
            client_name: format!("ramgrid-client/{}", env!("CARGO_PKG_VERSION")),
        }
    }
}

/// One server's `stats` as (name, value) pairs, in the server's order.
pub type ServerStats = Vec<(String, String)>;

/// What the client knows of a table (fixed at creation, so cached).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableMeta {
    /// Number of partitions.
    pub partitions: u32,
    /// Replication factor asked for at creation.
    pub replication: u32,
    /// Value type.
    pub value_type: ValueType,
    /// The table's identity (a table created again under its name has another).
    pub incarnation: u64,
}

/// A table as the whole cluster holds it (DESCRIBE_TABLE aggregated over servers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableDescription {
    /// Table name.
    pub name: String,
    /// Number of partitions.
    pub partitions: u32,
    /// Replication factor asked for at creation.
    pub replication: u32,
    /// Value type.
    pub value_type: ValueType,
    /// Durability, fixed at creation.
    pub durability: Durability,
    /// The table's identity, fixed at creation: a table created again under the same name has
    /// another one.
    pub incarnation: u64,
    /// The newest current version over the servers (during a switch, some may still point at the previous one).
    pub current_version: u32,
    /// The highest version number any server ever created in the table: new versions are
    /// numbered above it, so a number never names two contents.
    pub high_water: u32,
    /// Every version any server holds, ascending.
    pub versions: Vec<VersionSummary>,
    /// Servers that did not answer (down, or failed during the call): the description is that of
    /// the others, and items and bytes may then count short.
    pub unreachable: Vec<String>,
}

/// One version of a table over the whole cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VersionSummary {
    /// Version number.
    pub version: u32,
    /// Sealed on every server that holds it.
    pub sealed: bool,
    /// Items summed over servers, divided by the effective replication (each item counted once when
    /// every replica holds it).
    pub items: u64,
    /// Bytes, counted like `items`.
    pub bytes: u64,
}

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
    pub(crate) spec_retries: u32,
    pub(crate) topo: RwLock<Arc<Topology>>,
    pub(crate) pools: Mutex<HashMap<String, Arc<Pool>>>,
    pub(crate) tables: RwLock<HashMap<String, TableMeta>>,
    pub(crate) near: Option<NearCache>,
    /// (table, version) -> None when known sealed, Some(when) when seen unsealed.
    pub(crate) sealed: Mutex<HashMap<(String, u32), Option<Instant>>>,
    /// Smallest HELLO max_body seen (0 until a server told).
    pub(crate) max_body: AtomicU64,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.prober.stop();
    }
}

/// A spec, its epoch and pools, and the partition maps built from it.
pub(crate) struct Topology {
    pub(crate) spec: ClusterSpec,
    pub(crate) epoch: u64,
    pub(crate) pools: Vec<Arc<Pool>>,
    pub(crate) maps: Mutex<HashMap<(u32, u32), Arc<PartitionMap>>>,
}

impl Topology {
    /// Server indices, those that are up first, down ones last: for requests any one server can
    /// answer, so a hung or dead server is not waited for while another can be asked.
    pub(crate) fn healthiest_first(&self) -> Vec<usize> {
        let rank = |s: &usize| {
            let h = &self.pools[*s].health;
            (h.avoid_for_reads(), h.is_down())
        };
        let mut order: Vec<usize> = (0..self.pools.len()).collect();
        order.sort_by_key(rank);
        order
    }

    pub(crate) fn map(&self, meta: &TableMeta) -> Arc<PartitionMap> {
        self.maps
            .lock()
            .entry((meta.partitions, meta.replication))
            .or_insert_with(|| {
                Arc::new(PartitionMap::new(
                    &self.spec,
                    meta.partitions,
                    meta.replication,
                ))
            })
            .clone()
    }
}

/// Before the `attempt`-th retry after a stale-spec refusal: nothing for the first, then 10, 20,
/// 40, 80 ms. Servers install a committed spec each in its own time (a few milliseconds apart),
/// so a client may meet one still on the spec another has left; a short wait lets it catch up
/// instead of the client bouncing between the two.
pub(crate) fn stale_backoff(attempt: u32) {
    if attempt > 1 {
        std::thread::sleep(std::time::Duration::from_millis(10 << (attempt - 2).min(3)));
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
            pool_size: config.pool_size,
            client_name: config.client_name,
        };
        let inner = Inner {
            settings,
            call_timeout: config.call_timeout,
            prober: Prober::new(),
            ack: config.ack,
            spec_retries: config.spec_retries,
            topo: RwLock::new(Arc::new(Topology {
                epoch: spec.epoch(),
                spec: spec.clone(),
                pools: Vec::new(),
                maps: Mutex::new(HashMap::new()),
            })),
            pools: Mutex::new(HashMap::new()),
            tables: RwLock::new(HashMap::new()),
            near: (config.near_cache_bytes > 0).then(|| NearCache::new(config.near_cache_bytes)),
            sealed: Mutex::new(HashMap::new()),
            max_body: AtomicU64::new(0),
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

    pub(crate) fn topology(&self) -> Arc<Topology> {
        self.inner.topo.read().clone()
    }

    /// Installs `spec` as this client's view (a move it drives).
    pub(crate) fn adopt_spec(&self, spec: ClusterSpec) {
        self.adopt(spec)
    }

    /// Installs `spec` as this client's view, reusing the pools of servers it already knew.
    fn adopt(&self, spec: ClusterSpec) {
        let spec = spec.without_token();
        let pools = {
            let mut known = self.inner.pools.lock();
            spec.members()
                .iter()
                .map(|a| {
                    known
                        .entry(a.clone())
                        .or_insert_with(|| Arc::new(Pool::new(a.clone())))
                        .clone()
                })
                .collect()
        };
        let topo = Topology {
            epoch: spec.epoch(),
            spec,
            pools,
            maps: Mutex::new(HashMap::new()),
        };
        *self.inner.topo.write() = Arc::new(topo);
    }

    /// The servers of the current spec, in order.
    pub fn servers(&self) -> Vec<String> {
        self.topology().spec.servers().to_vec()
    }

    /// The epoch of the current spec.
    pub fn epoch(&self) -> u64 {
        self.topology().epoch
    }

    /// The current spec.
    pub fn spec(&self) -> ClusterSpec {
        self.topology().spec.clone()
    }

    /// Fetches the spec from the servers (the first that has one answers) and adopts it if its epoch
    /// differs from this client's.
    pub fn refresh_spec(&self) -> Result<()> {
        let _call = self.call();
        let topo = self.topology();
        let mut last = None;
        for s in topo.healthiest_first() {
            match self.fetch_spec(&topo, s) {
                Ok(Some(spec)) => {
                    if spec.epoch() != topo.epoch {
                        self.adopt(spec);
                    }
                    return Ok(());
                }
                Ok(None) => {}
                Err(e) => last = Some(e),
            }
        }
        match last {
            Some(e) => Err(e),
            None => Ok(()), // No server has a spec yet: ours stands (push_spec installs it).
        }
    }

    /// GET_SPEC from one server: `None` when it has none installed.
    fn fetch_spec(&self, topo: &Topology, s: usize) -> Result<Option<ClusterSpec>> {
        let mut spec = None;
        self.request(&topo.pools[s], &Request::GetSpec, |resp| match resp {
            Response::Spec(r) if r.epoch == 0 => Ok(()),
            Response::Spec(r) => {
                let parsed = ClusterSpec::parse_bytes(r.spec).map_err(|e| Error::Protocol {
                    server: topo.pools[s].addr.clone(),
                    message: format!("bad spec from server: {e}"),
                })?;
                spec = Some(parsed);
                Ok(())
            }
            other => Err(unexpected(&topo.pools[s].addr, &other)),
        })?;
        Ok(spec)
    }

    /// Sends this client's spec to every server (SET_SPEC); how a new cluster learns its layout.
    pub fn push_spec(&self) -> Result<()> {
        let _call = self.call();
        let topo = self.topology();
        let text = topo.spec.to_text();
        self.broadcast(
            &topo,
            &Request::SetSpec {
                spec: text.as_bytes(),
            },
            "",
            0,
            |_, resp| match resp {
                Response::SpecSet { .. } => Ok(()),
                other => Err(OpError::Fatal(Error::Protocol {
                    server: String::new(),
                    message: format!("unexpected reply {other:?}"),
                })),
            },
        )
    }

    /// After a stale-epoch refusal from server `s`: adopt its spec if it differs, forget the table's
    /// cached shape (it may have been recreated), and say whether a retry can help.
    pub(crate) fn on_stale(&self, topo: &Topology, s: usize, table: &str) -> Result<()> {
        self.inner.tables.write().remove(table);
        match self.fetch_spec(topo, s)? {
            Some(spec) if spec.epoch() != topo.epoch => self.adopt(spec),
            Some(_) => {}
            // A server of our spec that has none (it restarted empty): give it ours, as
            // `push_spec` would, so it refuses what it lacks (NO_SUCH_TABLE, and reads go to the
            // replicas) instead of every request failing on its epoch. A server the spec does not
            // list refuses it, and the call fails as before.
            None => {
                let text = topo.spec.to_text();
                self.request(
                    &topo.pools[s],
                    &Request::SetSpec {
                        spec: text.as_bytes(),
                    },
                    |resp| match resp {
                        Response::SpecSet { .. } => Ok(()),
                        Response::Error(e) => Err(Error::StaleSpec(format!(
                            "{} has no cluster spec installed and refused ours: {}",
                            topo.pools[s].addr, e.message
                        ))),
                        other => Err(unexpected(&topo.pools[s].addr, &other)),
                    },
                )?;
            }
        }
        Ok(())
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
    // Tables and versions

    /// A table's shape (partitions, replication, value type, incarnation), cached after the first
    /// ask. Every server that is up is asked, and the incarnation most of them hold wins: a server
    /// that lost the table (restarted empty) or holds another incarnation of its name (created
    /// there again) is outvoted, and then refuses the frames that name this one, so reads fail over
    /// to replicas that have it. A tie is an error, never a guess.
    pub fn table_meta(&self, table: &str) -> Result<TableMeta> {
        let _call = self.call();
        if let Some(m) = self.inner.tables.read().get(table) {
            return Ok(*m);
        }
        let topo = self.topology();
        let (answers, _unreachable) = self.ask_live(
            &topo,
            &Request::DescribeTable { name: table },
            describe_answer(&topo, table),
        )?;
        let infos: Vec<TableInfo> = answers.into_iter().flatten().flatten().collect();
        let meta = agreed_meta(table, &infos)?;
        self.inner.tables.write().insert(table.to_string(), meta);
        Ok(meta)
    }

    /// Creates a table on every server, with an open version 1 that is current, kept in memory
    /// only (see [`Client::create_table_with`]).
    pub fn create_table(
        &self,
        name: &str,
        partitions: u32,
        replication: u32,
        value_type: ValueType,
    ) -> Result<()> {
        self.create_table_with(
            name,
            partitions,
            replication,
            value_type,
            Durability::Memory,
        )
    }

    /// Creates a table on every server, with an open version 1 that is current, and a new
    /// incarnation id (random, the same on every server) that tells it from any earlier table of
    /// that name.
    pub fn create_table_with(
        &self,
        name: &str,
        partitions: u32,
        replication: u32,
        value_type: ValueType,
        durability: Durability,
    ) -> Result<()> {
        let _call = self.call();
        if partitions == 0 || replication == 0 {
            return Err(Error::InvalidArgument(
                "partitions and replication must be at least 1".into(),
            ));
        }
        if name.is_empty() || name.len() > ramgrid_proto::native::MAX_NAME_LEN {
            return Err(Error::InvalidArgument(format!(
                "table names are 1 to {} bytes",
                ramgrid_proto::native::MAX_NAME_LEN
            )));
        }
        let topo = self.topology();
        let req = Request::CreateTable(CreateTable {
            name,
            partitions,
            replication,
            value_type,
            durability,
            incarnation: new_incarnation(),
        });
        // A server that already has the table still lets the others create it, so a retry after a
        // partial failure converges; TABLE_EXISTS is reported once all have answered.
        let mut exists = false;
        let answers = self.ask_all(&topo, &req, |s, resp| match resp {
            Response::Done => Ok(()),
            Response::Error(e) if e.status == Status::TableExists => {
                exists = true;
                Ok(())
            }
            Response::Error(e) => Err(refusal_err(&topo.pools[s].addr, name, 0, e)),
            other => Err(unexpected(&topo.pools[s].addr, &other)),
        })?;
        debug_assert!(answers.iter().all(Option::is_some));
        self.forget_table(name);
        if exists {
            return Err(Error::TableExists(name.to_string()));
        }
        Ok(())
    }

    fn forget_table(&self, name: &str) {
        self.inner.tables.write().remove(name);
        self.inner.sealed.lock().retain(|(t, _), _| t != name);
        if let Some(n) = &self.inner.near {
            n.purge_table(name);
        }
    }

    /// Drops a table (every version) on every server. Fails only if no server had it.
    pub fn drop_table(&self, name: &str) -> Result<()> {
        let _call = self.call();
        let topo = self.topology();
        let mut dropped = false;
        self.ask_all(&topo, &Request::DropTable { name }, |s, resp| match resp {
            Response::Done => {
                dropped = true;
                Ok(())
            }
            Response::Error(e) if e.status == Status::NoSuchTable => Ok(()),
            Response::Error(e) => Err(refusal_err(&topo.pools[s].addr, name, 0, e)),
            other => Err(unexpected(&topo.pools[s].addr, &other)),
        })?;
        self.forget_table(name);
        if !dropped {
            return Err(Error::TableNotFound(name.to_string()));
        }
        Ok(())
    }

    /// Every table any server holds, aggregated like [`Client::describe_table`], by name. Like it,
    /// answers from the servers that are up.
    pub fn list_tables(&self) -> Result<Vec<TableDescription>> {
        let _call = self.call();
        let topo = self.topology();
        let (answers, unreachable) =
            self.ask_live(&topo, &Request::ListTables, |s, resp| match resp {
                Response::Tables(ts) => Ok(ts),
                Response::Error(e) => Err(refusal_err(&topo.pools[s].addr, "", 0, e)),
                other => Err(unexpected(&topo.pools[s].addr, &other)),
            })?;
        let mut by_name: std::collections::BTreeMap<String, Vec<TableInfo>> = Default::default();
        for t in answers.into_iter().flatten().flatten() {
            by_name.entry(t.name.clone()).or_default().push(t);
        }
        Ok(by_name
            .into_values()
            .map(|infos| aggregate(&topo, &infos, unreachable.clone()))
            .collect())
    }

    /// A table over the whole cluster: versions merged, items and bytes summed over servers and
    /// divided by the effective replication. A metadata read: servers that are down or fail are
    /// left out (named in [`TableDescription::unreachable`]); it fails only if none answers.
    pub fn describe_table(&self, name: &str) -> Result<TableDescription> {
        let _call = self.call();
        let topo = self.topology();
        let (answers, unreachable) = self.ask_live(
            &topo,
            &Request::DescribeTable { name },
            describe_answer(&topo, name),
        )?;
        let mut infos: Vec<TableInfo> = answers.into_iter().flatten().flatten().collect();
        // Servers holding another incarnation of the name (outvoted) describe another table.
        let agreed = agreed_meta(name, &infos)?.incarnation;
        infos.retain(|t| t.incarnation == agreed);
        Ok(aggregate(&topo, &infos, unreachable))
    }

    /// DESCRIBE_TABLE on every server, each of which must answer (for admin calls that need them
    /// all); the servers that do not have the table are left out.
    fn describe_all(&self, topo: &Topology, name: &str) -> Result<Vec<TableInfo>> {
        let answers = self.ask_all(
            topo,
            &Request::DescribeTable { name },
            describe_answer(topo, name),
        )?;
        Ok(answers.into_iter().flatten().flatten().collect())
    }

    /// The newest current version over the servers that answer (see [`Client::describe_table`]: a
    /// version becomes current only on every server at once, so those that answer agree).
    pub fn current_version(&self, table: &str) -> Result<u32> {
        Ok(self.describe_table(table)?.current_version)
    }

    /// Creates the next version (open, not current) on every server and returns its number: one more
    /// than the highest any server holds. If another client takes the number first, the versions this
    /// call created are dropped and the next number is tried.
    pub fn create_version(&self, table: &str) -> Result<u32> {
        let _call = self.call();
        let topo = self.topology();
        for _ in 0..CREATE_VERSION_TRIES {
            let infos = self.describe_all(&topo, table)?;
            if infos.is_empty() {
                return Err(Error::TableNotFound(table.to_string()));
            }
            // Above every number any server ever used (dropped versions included), so a number
            // never names two contents.
            let max = infos
                .iter()
                .flat_map(|t| t.versions.iter().map(|v| v.number))
                .chain(infos.iter().map(|t| t.current_version.max(t.high_water)))
                .max();
            let version = max.unwrap_or(0) + 1;
            // The same token on every server: the metadata group tells this call's creation,
            // proposed by whichever server comes first, from another client's (6.3).
            let creator = random_token();
            let req = Request::CreateVersion(VersionRef {
                table,
                version,
                creator,
            });
            let mut conflict = false;
            let created = self.ask_all(&topo, &req, |s, resp| match resp {
                Response::Done => Ok(true),
                Response::Error(e) if e.status == Status::VersionExists => {
                    conflict = true;
                    Ok(false)
                }
                Response::Error(e) => Err(refusal_err(&topo.pools[s].addr, table, version, e)),
                other => Err(unexpected(&topo.pools[s].addr, &other)),
            })?;
            if !conflict {
                return Ok(version);
            }
            for (s, made) in created.iter().enumerate() {
                if *made == Some(true) {
                    let _ = self.request(
                        &topo.pools[s],
                        &Request::DropVersion(VersionRef::new(table, version)),
                        |_| Ok(()),
                    );
                }
            }
            // Two clients racing for the same number back off by different random amounts.
            let jitter = random_token() % 16;
            std::thread::sleep(Duration::from_millis(1 + jitter));
        }
        Err(Error::Server {
            server: String::new(),
            status: "VERSION_EXISTS",
            message: format!(
                "could not create a new version of {table}: other clients kept taking the number"
            ),
        })
    }

    /// Seals a version on every server (idempotent).
    pub fn seal_version(&self, table: &str, version: u32) -> Result<()> {
        let _call = self.call();
        let topo = self.topology();
        let req = Request::SealVersion(VersionRef::new(table, version));
        self.ask_all(&topo, &req, |s, resp| match resp {
            Response::Done => Ok(()),
            Response::Error(e) if e.status == Status::VersionSealed => Ok(()),
            Response::Error(e) => Err(refusal_err(&topo.pools[s].addr, table, version, e)),
            other => Err(unexpected(&topo.pools[s].addr, &other)),
        })?;
        // Every server answered: the version is sealed everywhere, so the near cache may keep it.
        self.inner
            .sealed
            .lock()
            .insert((table.to_string(), version), None);
        Ok(())
    }

    /// Makes a version current on every server. Refused, with nothing switched, unless every server
    /// holds it sealed.
    pub fn set_current(&self, table: &str, version: u32) -> Result<()> {
        let _call = self.call();
        let topo = self.topology();
        let infos = self.describe_all(&topo, table)?;
        if infos.len() < topo.pools.len() {
            return Err(Error::TableNotFound(table.to_string()));
        }
        for t in &infos {
            match t.versions.iter().find(|v| v.number == version) {
                None => {
                    return Err(Error::VersionNotFound {
                        table: table.to_string(),
                        version,
                    })
                }
                Some(v) if !v.sealed => {
                    return Err(Error::VersionNotSealed {
                        table: table.to_string(),
                        version,
                    })
                }
                Some(_) => {}
            }
        }
        let req = Request::SetCurrent(VersionRef::new(table, version));
        self.broadcast(&topo, &req, table, version, |s, resp| match resp {
            Response::Done => Ok(()),
            other => Err(OpError::Fatal(unexpected(&topo.pools[s].addr, &other))),
        })
    }

    /// Drops a version on every server. Fails only if no server had it.
    pub fn drop_version(&self, table: &str, version: u32) -> Result<()> {
        let _call = self.call();
        let topo = self.topology();
        let req = Request::DropVersion(VersionRef::new(table, version));
        let mut dropped = false;
        self.ask_all(&topo, &req, |s, resp| match resp {
            Response::Done => {
                dropped = true;
                Ok(())
            }
            Response::Error(e)
                if matches!(e.status, Status::NoSuchVersion | Status::NoSuchTable) =>
            {
                Ok(())
            }
            Response::Error(e) => Err(refusal_err(&topo.pools[s].addr, table, version, e)),
            other => Err(unexpected(&topo.pools[s].addr, &other)),
        })?;
        // A later version may reuse the number: its values must not come from the old one's cache.
        self.inner
            .sealed
            .lock()
            .remove(&(table.to_string(), version));
        if let Some(n) = &self.inner.near {
            n.purge_table(table);
        }
        if !dropped {
            return Err(Error::VersionNotFound {
                table: table.to_string(),
                version,
            });
        }
        Ok(())
    }

    /// Whether `version` of `table` is sealed on every server (remembered once true).
    pub(crate) fn version_sealed(&self, table: &str, version: u32) -> bool {
        let key = (table.to_string(), version);
        match self.inner.sealed.lock().get(&key) {
            Some(None) => return true,
            Some(Some(at)) if at.elapsed() < UNSEALED_RECHECK => return false,
            _ => {}
        }
        let topo = self.topology();
        let sealed = match self.describe_all(&topo, table) {
            Ok(infos) => {
                infos.len() == topo.pools.len()
                    && infos
                        .iter()
                        .all(|t| t.versions.iter().any(|v| v.number == version && v.sealed))
            }
            Err(_) => false,
        };
        self.inner
            .sealed
            .lock()
            .insert(key, if sealed { None } else { Some(Instant::now()) });
        sealed
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
                    crate::stats::fetch(addr, settings.connect_timeout.min(left), left)
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

/// Takes one server's DESCRIBE_TABLE answer: `None` when it does not have the table.
fn describe_answer<'t>(
    topo: &'t Topology,
    name: &'t str,
) -> impl FnMut(usize, Response<'_>) -> Result<Option<TableInfo>> + 't {
    move |s, resp| match resp {
        Response::Table(t) => Ok(Some(t)),
        Response::Error(e) if e.status == Status::NoSuchTable => Ok(None),
        Response::Error(e) => Err(refusal_err(&topo.pools[s].addr, name, 0, e)),
        other => Err(unexpected(&topo.pools[s].addr, &other)),
    }
}

fn refusal_err(addr: &str, table: &str, version: u32, e: ErrorReply) -> Error {
    match refusal(0, addr, table, version, e) {
        OpError::Fatal(e) => e,
        OpError::Stale(_, m) => Error::StaleSpec(m),
    }
}

/// The table as most servers that answered hold it (by incarnation).
fn agreed_meta(table: &str, infos: &[TableInfo]) -> Result<TableMeta> {
    let mut counts: Vec<(u64, usize, &TableInfo)> = Vec::new();
    for t in infos {
        match counts.iter_mut().find(|(inc, _, _)| *inc == t.incarnation) {
            Some(c) => c.1 += 1,
            None => counts.push((t.incarnation, 1, t)),
        }
    }
    counts.sort_by_key(|c| std::cmp::Reverse(c.1));
    match counts.as_slice() {
        [] => Err(Error::TableNotFound(table.to_string())),
        [(_, n, _), (_, m, _), ..] if n == m => Err(Error::Protocol {
            server: String::new(),
            message: format!(
                "servers disagree about table {table}: as many hold one incarnation as another ({})",
                counts
                    .iter()
                    .map(|(inc, n, _)| format!("{inc:016x} on {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }),
        [(_, _, t), ..] => Ok(TableMeta {
            partitions: t.partitions,
            replication: t.replication,
            value_type: t.value_type,
            incarnation: t.incarnation,
        }),
    }
}

/// A new table incarnation id: random and never 0 (64 bits from the process's random hash keys,
/// the time and a counter, so two creations never share one in practice).
fn new_incarnation() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    h.write_u32(std::process::id());
    h.finish().max(1)
}

/// Merges one table's descriptions from several servers.
fn aggregate(topo: &Topology, infos: &[TableInfo], unreachable: Vec<String>) -> TableDescription {
    let first = &infos[0];
    let r = u64::from(first.replication.clamp(1, (topo.pools.len() as u32).max(1)));
    let mut versions: std::collections::BTreeMap<u32, VersionSummary> = Default::default();
    for t in infos {
        for v in &t.versions {
            let e = versions.entry(v.number).or_insert(VersionSummary {
                version: v.number,
                sealed: true,
                items: 0,
                bytes: 0,
            });
            e.sealed &= v.sealed;
            e.items += v.items;
            e.bytes += v.bytes;
        }
    }
    for v in versions.values_mut() {
        v.items = v.items.div_ceil(r);
        v.bytes = v.bytes.div_ceil(r);
    }
    TableDescription {
        name: first.name.clone(),
        partitions: first.partitions,
        replication: first.replication,
        value_type: first.value_type,
        durability: first.durability,
        incarnation: first.incarnation,
        current_version: infos.iter().map(|t| t.current_version).max().unwrap_or(0),
        high_water: infos.iter().map(|t| t.high_water).max().unwrap_or(0),
        versions: versions.into_values().collect(),
        unreachable,
    }
}

/// A random non-zero u64 (std's per-process random hash keys; no RNG dependency).
fn random_token() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish().max(1)
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

    #[test]
    fn aggregate_merges_versions_and_divides_by_replication() {
        let topo = Topology {
            spec: ClusterSpec::new(vec!["a:1".into(), "b:1".into(), "c:1".into()], None).unwrap(),
            epoch: 1,
            pools: (0..3)
                .map(|i| Arc::new(Pool::new(format!("s{i}"))))
                .collect(),
            maps: Mutex::new(HashMap::new()),
        };
        let info = |cur, sealed2, items| TableInfo {
            name: "t".into(),
            partitions: 8,
            replication: 2,
            value_type: ValueType::I64,
            durability: Durability::Memory,
            incarnation: 9,
            current_version: cur,
            high_water: 2 + cur,
            versions: vec![
                ramgrid_proto::native::VersionInfo {
                    number: 1,
                    sealed: true,
                    items,
                    bytes: 10 * items,
                },
                ramgrid_proto::native::VersionInfo {
                    number: 2,
                    sealed: sealed2,
                    items: 1,
                    bytes: 1,
                },
            ],
        };
        let d = aggregate(
            &topo,
            &[info(1, true, 4), info(2, false, 6), info(1, true, 10)],
            Vec::new(),
        );
        assert_eq!(d.current_version, 2);
        assert_eq!((d.high_water, d.incarnation), (4, 9));
        assert_eq!(
            d.versions[0],
            VersionSummary {
                version: 1,
                sealed: true,
                items: 10,
                bytes: 100
            }
        );
        assert!(!d.versions[1].sealed);
        assert_eq!(d.versions[1].items, 2);
    }
}
