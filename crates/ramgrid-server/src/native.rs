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

use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use ramgrid_proto::cluster::ClusterSpec;
use ramgrid_proto::native::{
    self as wire, parse_frame, ErrorReply, FrameError, GetReplyWriter, HelloOk, KeyStatusWriter,
    Opcode, Request, Response, SpecReply, Status, HEADER_LEN, PROTOCOL_VERSION,
};
use ramgrid_store::tables::{
    self, KeyStatus as StoreKeyStatus, TableSpec, TableVersion, Tables, ValueRef, ValueType,
};
use ramgrid_store::Error as StoreError;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::auth;
use crate::buffers::ConnMemory;
use crate::conn::{flush, read_or_stop, OUT_BASE};
use crate::stats::WorkerStats;
use crate::wal::{self, Log};

/// Flush replies mid-batch once this much is pending.
const OUT_HIGH_WATER: usize = 1 << 20;
const READ_CHUNK: usize = 64 << 10;
/// How long a GET waits for buffer memory before composing only what fits (the client then asks
/// for fewer keys at once).
const REPLY_MEMORY_WAIT: Duration = Duration::from_millis(100);

pub use crate::cluster::{held_partitions, ClusterState};

/// Everything the native protocol needs that the memcached side does not.
pub struct NativeState {
    /// The versioned tables.
    pub tables: Tables,
    /// The installed spec; `None` until `--cluster-spec` or SET_SPEC (then this server holds every partition).
    pub cluster: RwLock<Option<ClusterState>>,
    /// Token clients must present in HELLO.
    pub token: Option<String>,
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

/// The pairs of a PUT group that the store accepted, as log ops.
fn wal_puts<'a>(
    pairs: impl Iterator<Item = (&'a [u8], &'a [u8])>,
    status: &'a [u8],
) -> impl Iterator<Item = wal::Op<'a>> {
    pairs
        .zip(status)
        .filter(|(_, &s)| s == StoreKeyStatus::Ok as u8)
        .map(|((k, v), _)| wal::Op::Put(k, v))
}

/// The keys of a DELETE group that were removed (a missing key changes nothing), as log ops.
fn wal_deletes<'a>(
    keys: impl Iterator<Item = &'a [u8]>,
    status: &'a [u8],
) -> impl Iterator<Item = wal::Op<'a>> {
    keys.zip(status)
        .filter(|(_, &s)| s == StoreKeyStatus::Ok as u8)
        .map(|(k, _)| wal::Op::Delete(k))
}

/// Serves a native-protocol connection. `buf[..end]` already holds the first bytes read. With a
/// token, a connection that has not sent a good HELLO by `auth_deadline` is closed.
#[expect(clippy::too_many_arguments)]
pub async fn serve(
    mut sock: TcpStream,
    mut buf: Vec<u8>,
    mut end: usize,
    state: &NativeState,
    stats: &WorkerStats,
    mut stop: watch::Receiver<bool>,
    write_timeout: Duration,
    auth_deadline: Option<Instant>,
    mem: &mut ConnMemory<'_>,
) {
    let mut conn = Conn {
        authed: state.token.is_none(),
        status: Vec::new(),
        commit: None,
        metrics: Default::default(),
    };
    let mut out = Vec::with_capacity(READ_CHUNK);
    let mut start = 0usize;
    loop {
        loop {
            match parse_frame(&buf[start..end], state.max_body) {
                Ok((frame, used)) => {
                    let req = match Request::decode(&frame) {
                        Ok(r) => r,
                        Err(_) => {
                            // A body that does not decode: answer BAD_REQUEST, then close (protocol broken).
                            let e = ErrorReply::new(Status::BadRequest, "malformed request body");
                            let _ =
                                wire::encode_error(&mut out, frame.opcode, frame.request_id, &e);
                            let _ = flush(&mut sock, &mut out, stats, write_timeout, mem).await;
                            return;
                        }
                    };
                    // A GET reserves its reply's room in the buffer budget before composing it
                    // (briefly waiting when the budget is short); other replies are small.
                    let room = match &req {
                        Request::Get(b) => {
                            // Replies already waiting in `out` keep what they hold; this one
                            // gets room beyond that.
                            let held = out.len().saturating_sub(OUT_BASE);
                            let want = held + reply_bound(state, b);
                            let reserved = mem.reserve_reply(want, REPLY_MEMORY_WAIT).await;
                            (OUT_BASE + reserved).saturating_sub(out.len())
                        }
                        _ => state.max_body,
                    };
                    let before = out.len();
                    let started = std::time::Instant::now();
                    // The metadata group answers some requests itself, on its runtime (meta/mod.rs).
                    let answered = match state.meta.get().filter(|_| conn.authed) {
                        Some(m) => {
                            m.answer(state, &req, frame.opcode, frame.request_id, &mut out)
                                .await
                        }
                        None => None,
                    };
                    let mut refused = match answered {
                        Some(refused) => refused,
                        None => {
                            conn.handle(state, frame.opcode, frame.request_id, &req, &mut out, room)
                        }
                    };
                    // A write to a log table is answered only once its log records are on disk
                    // (wal.rs); the wait lets this worker's other connections go on.
                    if let Some((log, ticket)) = conn.commit.take() {
                        if let Err(e) = log.commit_async(ticket).await {
                            out.truncate(before);
                            let e = disk_refusal(e);
                            refused = Some(e.status);
                            let _ =
                                wire::encode_error(&mut out, frame.opcode, frame.request_id, &e);
                        }
                    }
                    conn.metrics
                        .record(stats, &req, &conn.status, refused, started);
                    mem.settle_reply(out.capacity().saturating_sub(OUT_BASE));
                    start += used;
                    if out.len() >= OUT_HIGH_WATER
                        && flush(&mut sock, &mut out, stats, write_timeout, mem)
                            .await
                            .is_err()
                    {
                        return;
                    }
                }
                Err(FrameError::Incomplete { needed }) => {
                    // Grow once to the size the header announced (bounded by max_body), after the
                    // buffer budget granted it (backpressure: the frame waits, unread, meanwhile).
                    if needed > buf.len() - start {
                        buf.copy_within(start..end, 0);
                        end -= start;
                        start = 0;
                        if needed > buf.len() {
                            let deadline = Instant::now() + write_timeout;
                            if !mem
                                .grow_read(needed.saturating_sub(READ_CHUNK), deadline)
                                .await
                            {
                                return;
                            }
                            buf.resize(needed, 0);
                        }
                    }
                    break;
                }
                Err(_) => {
                    // Bad magic, unknown opcode, oversized body: the peer broke the protocol.
                    let _ = flush(&mut sock, &mut out, stats, write_timeout, mem).await;
                    return;
                }
            }
        }
        if !out.is_empty()
            && flush(&mut sock, &mut out, stats, write_timeout, mem)
                .await
                .is_err()
        {
            return;
        }
        if start == end {
            start = 0;
            end = 0;
            if buf.len() > READ_CHUNK {
                buf = vec![0u8; READ_CHUNK];
                mem.shrink_read();
            }
        } else if buf.len() - end < READ_CHUNK / 4 {
            buf.copy_within(start..end, 0);
            end -= start;
            start = 0;
            if buf.len() - end < READ_CHUNK / 4 {
                // Only a frame header is left unparsed here (whole frames were parsed above).
                let grow = buf.len() + READ_CHUNK;
                if !mem
                    .grow_read(grow - READ_CHUNK, Instant::now() + write_timeout)
                    .await
                {
                    return;
                }
                buf.resize(grow, 0);
            }
        }
        let deadline = auth_deadline.filter(|_| !conn.authed);
        let Some(n) = read_or_stop(&mut sock, &mut buf[end..], &mut stop, stats, deadline).await
        else {
            return;
        };
        end += n;
    }
}

/// Per-connection state: whether HELLO authenticated it, scratch buffers reused across frames,
/// and the log commit the request just handled must wait for before it is answered.
struct Conn {
    authed: bool,
    status: Vec<u8>,
    commit: Option<(Arc<Log>, u64)>,
    metrics: crate::metrics::ConnMetrics,
}

pub(crate) fn store_value_type(vt: wire::ValueType) -> ValueType {
    match vt {
        wire::ValueType::Bytes => ValueType::Bytes,
        wire::ValueType::I64 => ValueType::I64,
        wire::ValueType::F64 => ValueType::F64,
        wire::ValueType::F32Vec(dim) => ValueType::F32Vec { dim },
    }
}

fn wire_value_type(vt: ValueType) -> wire::ValueType {
    match vt {
        ValueType::Bytes => wire::ValueType::Bytes,
        ValueType::I64 => wire::ValueType::I64,
        ValueType::F64 => wire::ValueType::F64,
        ValueType::F32Vec { dim } => wire::ValueType::F32Vec(dim),
    }
}

fn wire_key_status(s: u8) -> wire::KeyStatus {
    match StoreKeyStatus::from_u8(s) {
        Some(StoreKeyStatus::Ok) => wire::KeyStatus::Ok,
        Some(StoreKeyStatus::NotFound) | None => wire::KeyStatus::NotFound,
        Some(StoreKeyStatus::KeyTooLarge) => wire::KeyStatus::KeyTooLarge,
        Some(StoreKeyStatus::ValueTooLarge) => wire::KeyStatus::ValueTooLarge,
        Some(StoreKeyStatus::WrongType) => wire::KeyStatus::WrongType,
        Some(StoreKeyStatus::OutOfMemory) => wire::KeyStatus::OutOfMemory,
    }
}

// The GET reply copies the store's status bytes as they are; they must mean what the wire's do.
// Checked at compile time.
const _: () = {
    use wire::KeyStatus as W;
    use StoreKeyStatus as S;
    assert!(S::Ok as u8 == W::Ok as u8);
    assert!(S::NotFound as u8 == W::NotFound as u8);
    assert!(S::KeyTooLarge as u8 == W::KeyTooLarge as u8);
    assert!(S::ValueTooLarge as u8 == W::ValueTooLarge as u8);
    assert!(S::WrongType as u8 == W::WrongType as u8);
    assert!(S::OutOfMemory as u8 == W::OutOfMemory as u8);
};

/// Bytes of a GET reply body besides its status bytes and values: the version, value type and
/// counts (section 7.2 of the spec), generously.
const REPLY_HEADER_SLACK: usize = 64;

/// The most a GET's reply can take: exact for fixed-width values; the body limit for bytes.
fn reply_bound(state: &NativeState, get: &wire::KeyBatch<'_>) -> usize {
    let keys = get.groups.key_count();
    let width = state
        .tables
        .value_type(get.table)
        .ok()
        .and_then(|vt| vt.packed_width());
    match width {
        Some(w) => keys
            .saturating_mul(w + 1)
            .saturating_add(REPLY_HEADER_SLACK + wire::HEADER_LEN)
            .min(state.max_body),
        None => state.max_body,
    }
}

/// A data-directory write that failed: the change is refused (or, where memory already changed,
/// reported) with what failed.
fn disk_refusal(e: String) -> ErrorReply {
    ErrorReply::new(Status::Internal, format!("data directory: {e}"))
}

/// Maps a store error to the frame-level refusal the protocol defines.
pub(crate) fn refusal(e: &StoreError) -> ErrorReply {
    let status = match e {
        StoreError::NoSuchTable(_) => Status::NoSuchTable,
        StoreError::TableExists(_) => Status::TableExists,
        StoreError::NoSuchVersion(_) => Status::NoSuchVersion,
        StoreError::VersionExists(_) | StoreError::VersionNumberUsed { .. } => {
            Status::VersionExists
        }
        StoreError::VersionSealed(_) => Status::VersionSealed,
        StoreError::VersionOpen(_) => Status::VersionNotSealed,
        StoreError::NotHeld(p) => return ErrorReply::not_owner(vec![*p]),
        StoreError::Repairing(p) => return ErrorReply::repairing(vec![*p]),
        StoreError::VersionCurrent(_) => Status::BadRequest,
        StoreError::OutOfMemory => Status::OutOfMemory,
        StoreError::TooLarge | StoreError::ReplyTooLarge(_) => Status::TooLarge,
        _ => Status::BadRequest,
    };
    ErrorReply::new(status, e.to_string())
}

impl Conn {
    fn handle(
        &mut self,
        state: &NativeState,
        op: Opcode,
        id: u64,
        req: &Request<'_>,
        out: &mut Vec<u8>,
        room: usize,
    ) -> Option<Status> {
        let e = self.try_handle(state, op, id, req, out, room).err()?;
        let _ = wire::encode_error(out, op, id, &e);
        Some(e.status)
    }

    fn try_handle(
        &mut self,
        state: &NativeState,
        op: Opcode,
        id: u64,
        req: &Request<'_>,
        out: &mut Vec<u8>,
        room: usize,
    ) -> Result<(), ErrorReply> {
        let done = |out: &mut Vec<u8>, resp: Response<'_>| {
            resp.encode(out, op, id)
                .map_err(|e| ErrorReply::new(Status::Internal, e.to_string()))
        };
        match req {
            Request::Hello(h) => {
                if h.protocol_version != PROTOCOL_VERSION {
                    return Err(ErrorReply::new(
                        Status::UnsupportedProtocol,
                        "this server speaks protocol version 1",
                    ));
                }
                if let Some(token) = &state.token {
                    if !auth::token_matches(h.token, token) {
                        self.authed = false;
                        return Err(ErrorReply::new(Status::AuthFailed, "wrong auth token"));
                    }
                }
                self.authed = true;
                let max_body = u32::try_from(state.max_body).unwrap_or(u32::MAX);
                let hello = HelloOk {
                    protocol_version: PROTOCOL_VERSION,
                    server_id: &state.server_id,
                    epoch: state.epoch(),
                    max_body,
                };
                return done(out, Response::Hello(hello));
            }
            Request::Ping => return done(out, Response::Done),
            _ if !self.authed => {
                return Err(ErrorReply::new(
                    Status::AuthRequired,
                    "send HELLO with the auth token first",
                ))
            }
            _ => {}
        }
        match req {
            Request::Hello(_) | Request::Ping => unreachable!("answered above"),
            Request::Raft { .. } => Err(ErrorReply::new(
                Status::BadRequest,
                "this server runs no metadata group",
            )),
            Request::CreateTable(c) => {
                state.check_quorum()?;
                if c.partitions == 0 || c.partitions > tables::MAX_PARTITIONS {
                    return Err(ErrorReply::new(
                        Status::BadRequest,
                        format!("partitions must be 1..={}", tables::MAX_PARTITIONS),
                    ));
                }
                let spec = TableSpec {
                    name: c.name.to_owned(),
                    partitions: c.partitions,
                    replication: c.replication.max(1),
                    value_type: store_value_type(c.value_type),
                    durability: match c.durability {
                        wire::Durability::Memory => tables::Durability::Memory,
                        wire::Durability::Snapshot => tables::Durability::Snapshot,
                        wire::Durability::Log => tables::Durability::Log,
                    },
                    incarnation: c.incarnation,
                };
                if let Ok(have) = state.tables.describe(&spec.name) {
                    // The same table (its incarnation is the creator's, random): this server
                    // learned it from a peer first (repair.rs). Creating it is then done.
                    // Its creation is happening now, so no write predates it: nothing to copy.
                    if have.spec == spec {
                        let _ = state.tables.clear_pending(&spec.name);
                        return done(out, Response::Done);
                    }
                }
                let held = held_partitions(state.cluster.read().as_ref(), &spec);
                let name = spec.name.clone();
                let theirs = spec.clone();
                match state.tables.create_table(spec, &held) {
                    // Learned from a peer between the check above and here: the same table.
                    Err(StoreError::TableExists(_))
                        if state.tables.describe(&name).is_ok_and(|h| h.spec == theirs) =>
                    {
                        let _ = state.tables.clear_pending(&name);
                        return done(out, Response::Done);
                    }
                    r => r.map_err(|e| refusal(&e))?,
                }
                if let Err(e) = state.sync_catalog(&name) {
                    // Not durable, so not created: a table that says "snapshot" must be on disk.
                    let _ = state.tables.drop_table(&name);
                    return Err(e);
                }
                done(out, Response::Done)
            }
            Request::DropTable { name } => {
                state.check_quorum()?;
                if let (Some(p), Ok(info)) = (&state.persist, state.tables.describe(name)) {
                    p.drop_table(&info.spec).map_err(disk_refusal)?;
                }
                state.tables.drop_table(name).map_err(|e| refusal(&e))?;
                done(out, Response::Done)
            }
            Request::ListTables => {
                let infos = state
                    .tables
                    .list()
                    .iter()
                    .filter_map(|n| state.tables.describe(n).ok())
                    .map(table_info)
                    .collect();
                done(out, Response::Tables(infos))
            }
            Request::DescribeTable { name } => {
                let info = state.tables.describe(name).map_err(|e| refusal(&e))?;
                done(out, Response::Table(table_info(info)))
            }
            Request::CreateVersion(v)
            | Request::SealVersion(v)
            | Request::SetCurrent(v)
            | Request::DropVersion(v) => {
                state.check_quorum()?;
                if v.version == 0 {
                    return Err(ErrorReply::new(
                        Status::BadRequest,
                        "version numbers start at 1",
                    ));
                }
                let n = v.version;
                if let Request::SealVersion(_) = req {
                    // A seal would freeze a partition half copied in.
                    if let Some(pv) = state
                        .tables
                        .pending(v.table)
                        .unwrap_or_default()
                        .into_iter()
                        .find(|pv| pv.version == n)
                    {
                        let mut e = ErrorReply::repairing(pv.partitions);
                        e.message = format!(
                            "version {n} still has partitions being copied in here: seal again once the repair is done"
                        );
                        return Err(e);
                    }
                }
                if let (Request::SealVersion(_), Some(p)) = (req, &state.persist) {
                    p.seal(&state.tables, v.table, n).map_err(|e| match e {
                        crate::persist::SealError::Store(e) => refusal(&e),
                        crate::persist::SealError::Disk(e) => disk_refusal(e),
                    })?;
                    return done(out, Response::Done);
                }
                if let Request::CreateVersion(_) = req {
                    // Learned from a peer an instant before its creator got here (repair.rs).
                    if state
                        .tables
                        .claim_learned_version(v.table, n)
                        .unwrap_or(false)
                    {
                        return done(out, Response::Done);
                    }
                }
                let r = match req {
                    Request::CreateVersion(_) => state.tables.create_version(v.table, n),
                    Request::SealVersion(_) => state.tables.seal_version(v.table, n),
                    Request::SetCurrent(_) => state.tables.set_current(v.table, n),
                    _ => state.tables.drop_version(v.table, n, false),
                };
                if let (Err(StoreError::VersionExists(_)), Request::CreateVersion(_)) = (&r, req) {
                    // Learned from a peer between the claim above and here.
                    if state
                        .tables
                        .claim_learned_version(v.table, n)
                        .unwrap_or(false)
                    {
                        return done(out, Response::Done);
                    }
                }
                r.map_err(|e| refusal(&e))?;
                if let (Request::DropVersion(_), Some(p)) = (req, &state.persist) {
                    p.drop_version(&state.tables, v.table, n)
                        .map_err(disk_refusal)?;
                } else if let Err(e) = state.sync_catalog(v.table) {
                    if let Request::CreateVersion(_) = req {
                        // Not durable, so not created (its number stays used).
                        let _ = state.tables.drop_version(v.table, n, true);
                    }
                    return Err(e);
                }
                done(out, Response::Done)
            }
            Request::SetSpec { spec } => {
                let spec = ClusterSpec::parse_bytes(spec)
                    .map_err(|e| ErrorReply::new(Status::BadRequest, e.to_string()))?;
                let epoch = state
                    .install_spec(spec)
                    .map_err(|e| ErrorReply::new(Status::BadRequest, e))?;
                done(out, Response::SpecSet { epoch })
            }
            Request::ExportPartition(x) => {
                let (eid, image, sealed, range) = state.exports.chunk(state, x, state.max_body)?;
                done(
                    out,
                    Response::Export(crate::export::reply(eid, &image, sealed, range)),
                )
            }
            Request::ClusterStatus => {
                let text = crate::cluster::status_text(state);
                done(out, Response::Status(&text))
            }
            Request::Metrics => {
                let text = state.metrics.render(state).unwrap_or_default();
                done(out, Response::Metrics(&text))
            }
            Request::GetSpec => {
                let cluster = state.cluster.read();
                let (epoch, text) = match cluster.as_ref() {
                    Some(c) => (c.epoch, c.spec.to_text()),
                    None => (0, String::new()),
                };
                done(
                    out,
                    Response::Spec(SpecReply {
                        epoch,
                        spec: text.as_bytes(),
                    }),
                )
            }
            Request::Get(b) => {
                check_epoch(&state.cluster.read(), b.epoch, false)?;
                state.check_quorum()?;
                // Resolve the version once: every group of this frame reads that one version.
                let tv = state
                    .tables
                    .at(b.table, b.version)
                    .map_err(|e| refusal(&e))?;
                check_incarnation(&tv, b.incarnation)?;
                check_held(&tv, b.groups.iter().map(|g| g.partition))?;
                check_copied(&tv, b.groups.iter().map(|g| g.partition))?;
                // One call for the whole frame: its lookups share one prefetching pipeline
                // whatever the number of partitions (a group per partition holds few keys).
                // No reply frame is larger than the body limit HELLO announced (that of requests)
                // nor than the room the buffer budget gave it: a GET whose values would pass
                // either is refused (TOO_LARGE: the client asks for fewer keys), never composed
                // whole. The values go straight into the reply frame.
                let keys = b.groups.key_count();
                let max_values = state
                    .max_body
                    .min(room)
                    .saturating_sub(keys + REPLY_HEADER_SLACK);
                let enc = |e: FrameError| ErrorReply::new(Status::Internal, e.to_string());
                let wvt = wire_value_type(tv.value_type());
                let mut w = GetReplyWriter::begin(out, id, tv.version(), wvt, keys).map_err(enc)?;
                // The store's packed layout is the wire's (7.2) and its status bytes are the
                // wire's (checked at compile time next to `refusal`).
                w.fill_packed(&mut self.status, |status, values| {
                    tv.get_groups_bounded(
                        b.groups.iter().map(|g| (g.partition, g.keys)),
                        status,
                        values,
                        max_values,
                    )
                })
                .map_err(enc)?
                .map_err(|e| refusal(&e))?;
                w.finish().map_err(enc)
            }
            Request::Put(p) => {
                // Held until the write is done: a spec change waits for it (cluster.rs).
                let cluster = state.cluster.read();
                check_epoch(&cluster, p.epoch, true)?;
                state.check_quorum()?;
                let tv = writable(
                    state,
                    p.table,
                    p.version,
                    p.incarnation,
                    p.groups.iter().map(|g| g.partition),
                )?;
                let vt = tv.value_type();
                let type_ok = store_value_type(p.value_type) == vt;
                let (log, mut ticket) = (state.log_of(&tv)?, 0);
                self.status.clear();
                for g in p.groups.iter() {
                    if !type_ok {
                        self.status.extend(std::iter::repeat_n(
                            StoreKeyStatus::WrongType as u8,
                            g.keys.len(),
                        ));
                        continue;
                    }
                    let items = g.keys.zip(g.values).map(|(k, v)| (k, value_ref(vt, v)));
                    tv.put_batch_then(g.partition, items, &mut self.status, |st| {
                        if let Some(log) = &log {
                            ticket = log.append(g.partition, wal_puts(g.keys.zip(g.values), st));
                        }
                    })
                    .map_err(|e| refusal(&e))?;
                }
                self.commit = log.map(|log| (log, ticket));
                self.write_statuses(out, Opcode::Put, id)
            }
            Request::Delete(b) => {
                let cluster = state.cluster.read();
                check_epoch(&cluster, b.epoch, true)?;
                state.check_quorum()?;
                let tv = writable(
                    state,
                    b.table,
                    b.version,
                    b.incarnation,
                    b.groups.iter().map(|g| g.partition),
                )?;
                let (log, mut ticket) = (state.log_of(&tv)?, 0);
                self.status.clear();
                for g in b.groups.iter() {
                    tv.delete_batch_then(g.partition, g.keys, &mut self.status, |st| {
                        if let Some(log) = &log {
                            ticket = log.append(g.partition, wal_deletes(g.keys, st));
                        }
                    })
                    .map_err(|e| refusal(&e))?;
                }
                self.commit = log.map(|log| (log, ticket));
                self.write_statuses(out, Opcode::Delete, id)
            }
        }
    }

    fn write_statuses(&self, out: &mut Vec<u8>, op: Opcode, id: u64) -> Result<(), ErrorReply> {
        let enc = |e: FrameError| ErrorReply::new(Status::Internal, e.to_string());
        let mut w = KeyStatusWriter::begin(out, op, id, self.status.len()).map_err(enc)?;
        for &s in &self.status {
            w.push(wire_key_status(s)).map_err(enc)?;
        }
        w.finish().map_err(enc)
    }
}

/// Decodes one wire value (already validated by the codec) into the store's view.
pub(crate) fn value_ref(vt: ValueType, v: &[u8]) -> ValueRef<'_> {
    let eight = |v: &[u8]| -> [u8; 8] { v.try_into().unwrap_or_default() };
    match vt {
        ValueType::I64 => ValueRef::I64(i64::from_le_bytes(eight(v))),
        ValueType::F64 => ValueRef::F64(f64::from_le_bytes(eight(v))),
        ValueType::F32Vec { .. } => ValueRef::F32VecLe(v),
        ValueType::Bytes => ValueRef::Bytes(v),
    }
}

/// The version a PUT or DELETE writes: resolved once, refused if sealed or if any of the request's
/// partitions is not held here, before any key is touched.
fn writable(
    state: &NativeState,
    table: &str,
    version: u32,
    incarnation: u64,
    partitions: impl Iterator<Item = u32>,
) -> Result<TableVersion, ErrorReply> {
    let tv = state.tables.at(table, version).map_err(|e| refusal(&e))?;
    check_incarnation(&tv, incarnation)?;
    if tv.is_sealed() {
        return Err(refusal(&StoreError::VersionSealed(tv.version())));
    }
    check_held(&tv, partitions)?;
    Ok(tv)
}

/// Refuses a batch meant for another incarnation of the table (one dropped since, whose name was
/// used again): its keys, types and version numbers are not this table's. 0 names any.
fn check_incarnation(tv: &TableVersion, incarnation: u64) -> Result<(), ErrorReply> {
    let mine = tv.spec().incarnation;
    if incarnation != 0 && incarnation != mine {
        return Err(ErrorReply::new(
            Status::NoSuchTable,
            format!(
                "table {} is another incarnation ({mine:016x}, not {incarnation:016x}): it was dropped and created again",
                tv.spec().name
            ),
        ));
    }
    Ok(())
}

fn check_epoch(
    cluster: &Option<crate::cluster::ClusterState>,
    epoch: u64,
    write: bool,
) -> Result<(), ErrorReply> {
    crate::cluster::check_epoch(cluster, epoch, write)
}

/// Refuses with REPAIRING, listing them, a read of partitions this server holds but is still
/// copying in from a replica: the client reads them elsewhere.
fn check_copied(
    tv: &TableVersion,
    partitions: impl Iterator<Item = u32>,
) -> Result<(), ErrorReply> {
    let mut pending: Vec<u32> = partitions.filter(|&p| tv.is_missing(p)).collect();
    if pending.is_empty() {
        return Ok(());
    }
    pending.sort_unstable();
    pending.dedup();
    Err(ErrorReply::repairing(pending))
}

/// Refuses with NOT_OWNER listing every requested partition this server does not hold, before any key is touched.
fn check_held(tv: &TableVersion, partitions: impl Iterator<Item = u32>) -> Result<(), ErrorReply> {
    let mut missing: Vec<u32> = partitions.filter(|&p| !tv.is_held(p)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    missing.sort_unstable();
    missing.dedup();
    Err(ErrorReply::not_owner(missing))
}

fn table_info(info: tables::TableInfo) -> wire::TableInfo {
    wire::TableInfo {
        name: info.spec.name,
        partitions: info.spec.partitions,
        replication: info.spec.replication,
        value_type: wire_value_type(info.spec.value_type),
        durability: match info.spec.durability {
            tables::Durability::Memory => wire::Durability::Memory,
            tables::Durability::Snapshot => wire::Durability::Snapshot,
            tables::Durability::Log => wire::Durability::Log,
        },
        incarnation: info.spec.incarnation,
        current_version: info.current,
        high_water: info.high_water,
        versions: info
            .versions
            .iter()
            .map(|v| wire::VersionInfo {
                number: v.number,
                sealed: v.sealed,
                items: v.items,
                bytes: v.bytes,
            })
            .collect(),
    }
}

/// Bytes of the frame header, re-exported for the connection's protocol sniffing.
pub const FRAME_HEADER_LEN: usize = HEADER_LEN;
