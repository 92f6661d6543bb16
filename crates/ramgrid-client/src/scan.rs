//! Scans and filters of a whole table (SCAN, docs/protocol-native.md section 11), and `top_k`: an
//! iterator over chunks of keys and values, one partition at a time in partition order, each page
//! asked through the partition round (`round.rs`: one replica, failover on NO_QUORUM, REPAIRING,
//! INTERNAL, NO_SUCH_TABLE).
//!
//! One moment per partition:
//! 1. A partition's pages are buffered until its last one; only then are its chunks yielded. A
//!    page answered CHANGED (the partition was written between pages, or the page went to
//!    another replica) discards what was buffered and reads the partition again from its start.
//!    Most partitions come in one page (its byte budget is half the frame limit), read under one
//!    hold of the partition's lock, so a restart is rare; after `max_restarts` of one partition
//!    the scan fails with an error that says so.
//! 2. The first page resolves the version (0 = current) and the incarnation; every later page
//!    names them, so the whole scan reads one version of one table.
//! 3. A refused page (WRONG_EPOCH, NOT_OWNER) is asked again after the spec is refreshed, up to
//!    the client's spec retries; the partition is then named in the error.
//!
//! Cancelling: drop the iterator. The server keeps nothing between pages.

use std::collections::VecDeque;

use ramgrid_proto::native::{
    encode_scan, Cursor, Opcode, PageState, Predicate, Response, ScanReply, ScanRequest, ValueType,
};

use crate::client::{encode_err, unexpected, Client, Handled, OpError, TableMeta};
use crate::error::{Error, Result};
use crate::ops::{OpResult, OpSpec};
use crate::round::{Pick, RoundIo};
use crate::values::Values;

/// What [`Client::top_k`] answers: (key, value of the column), best first.
pub type TopItems = Vec<(Vec<u8>, f64)>;

/// How a scan cuts and bounds its work.
#[derive(Debug, Clone, Copy)]
pub struct ScanOptions {
    /// Most items per chunk yielded (pages from the servers are larger; see the module).
    pub chunk_items: usize,
    /// Restarts of one partition (written during its scan) before the scan fails.
    pub max_restarts: u32,
}

impl Default for ScanOptions {
    fn default() -> ScanOptions {
        ScanOptions {
            chunk_items: 1 << 16,
            max_restarts: 8,
        }
    }
}

/// Keys packed: key `i` is `data[offsets[i]..offsets[i + 1]]` (what pyarrow's large binary
/// arrays hold, so they cross to Python without a copy per key).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PackedKeys {
    /// `n + 1` offsets, from 0.
    pub offsets: Vec<i64>,
    /// Every key's bytes, back to back.
    pub data: Vec<u8>,
}

impl PackedKeys {
    fn new() -> PackedKeys {
        PackedKeys {
            offsets: vec![0],
            data: Vec::new(),
        }
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Key `i`.
    pub fn get(&self, i: usize) -> &[u8] {
        &self.data[self.offsets[i] as usize..self.offsets[i + 1] as usize]
    }

    fn push(&mut self, k: &[u8]) {
        self.data.extend_from_slice(k);
        self.offsets.push(self.data.len() as i64);
    }
}

/// Some items of one partition, all of one moment of it.
#[derive(Debug, Clone, PartialEq)]
pub struct Chunk {
    /// The partition they come from.
    pub partition: u32,
    /// The version read.
    pub version: u32,
    /// The keys.
    pub keys: PackedKeys,
    /// One value per key (every one found: `BytesValues::spans` cover `data` in order).
    pub values: Values,
}

impl Chunk {
    fn new(partition: u32, version: u32, vt: ValueType) -> Chunk {
        Chunk {
            partition,
            version,
            keys: PackedKeys::new(),
            values: Values::zeroed(vt, 0),
        }
    }

    /// Number of items.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether it holds no item.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Appends one page's items, starting new chunks every `per` items. Keys are copied one by
    /// one; fixed-width values as whole runs of the page's packed array.
    fn append(out: &mut Vec<Chunk>, page: &ScanReply<'_>, per: usize) {
        let (p, v, vt) = (page.head.partition, page.head.version, page.head.value_type);
        let mut keys = page.keys;
        let mut values = page.values;
        let width = vt_width(vt);
        let mut left = keys.len();
        while left > 0 {
            if out.last().is_none_or(|c| c.len() >= per) {
                out.push(Chunk::new(p, v, vt));
            }
            let c = out.last_mut().expect("pushed above");
            let take = left.min(per - c.len());
            c.keys.offsets.reserve(take);
            for k in keys.by_ref().take(take) {
                c.keys.push(k);
            }
            match values.packed() {
                Some(raw) if width > 0 => {
                    append_packed(&mut c.values, &raw[..(take * width).min(raw.len())]);
                    values = values.skip_packed(take);
                }
                _ => {
                    for val in values.by_ref().take(take) {
                        if let Values::Bytes(b) = &mut c.values {
                            b.spans.push((b.data.len(), val.len()));
                            b.data.extend_from_slice(val);
                        }
                    }
                }
            }
            left -= take;
        }
    }
}

/// Bytes of one value of a fixed-width type (0 for bytes).
fn vt_width(vt: ValueType) -> usize {
    match vt {
        ValueType::I64 | ValueType::F64 => 8,
        ValueType::F32Vec(dim) => 4 * dim as usize,
        ValueType::Bytes => 0,
    }
}

/// Appends the little-endian values packed in `run` (whole values) to `values`.
fn append_packed(values: &mut Values, run: &[u8]) {
    match values {
        Values::I64(x) => x.extend(
            run.chunks_exact(8)
                .map(|b| i64::from_le_bytes(b.try_into().expect("chunks of 8"))),
        ),
        Values::F64(x) => x.extend(
            run.chunks_exact(8)
                .map(|b| f64::from_le_bytes(b.try_into().expect("chunks of 8"))),
        ),
        Values::F32Vec { data, .. } => data.extend(
            run.chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().expect("chunks of 4"))),
        ),
        Values::Bytes(_) => {}
    }
}

/// An iterator over a table's items in chunks (see the module); from [`Client::scan`].
#[derive(Debug)]
pub struct Scan {
    client: Client,
    table: String,
    meta: TableMeta,
    version: u32,
    incarnation: u64,
    predicate: Option<Predicate>,
    opts: ScanOptions,
    next_partition: u32,
    end_partition: u32,
    ready: VecDeque<Chunk>,
    failed: bool,
    /// The server (address) whose replica is asked first, where every replica holds the data
    /// (see [`Scan::prefer`]).
    prefer: Option<String>,
    /// Whether `prefer` applies (decided at the first page, from the version asked for).
    prefer_ok: Option<bool>,
    /// Partitions read again because they changed between pages (all partitions so far).
    pub restarts: u32,
}

impl Client {
    /// Scans `table` at `version` (0 = current) of incarnation `incarnation` (0 = whichever
    /// exists): every item, or with `predicate` those whose value satisfies it (a filter), in
    /// chunks of up to `opts.chunk_items`, one partition at a time. See the module for what the
    /// chunks of one partition guarantee.
    pub fn scan(
        &self,
        table: &str,
        version: u32,
        incarnation: u64,
        predicate: Option<Predicate>,
        opts: ScanOptions,
    ) -> Result<Scan> {
        if opts.chunk_items == 0 {
            return Err(Error::InvalidArgument(
                "chunk_items must be at least 1".into(),
            ));
        }
        if let Some(p) = &predicate {
            if p.lo.is_nan() || p.hi.is_nan() {
                return Err(Error::InvalidArgument("a predicate bound is NaN".into()));
            }
        }
        let meta = self.table_meta(table)?;
        if incarnation != 0 && meta.incarnation != incarnation {
            return Err(Error::TableNotFound(format!(
                "{table} (the version asked for belonged to a table of that name dropped since)"
            )));
        }
        Ok(Scan {
            client: self.clone(),
            table: table.to_string(),
            meta,
            version,
            incarnation: meta.incarnation,
            predicate,
            opts,
            next_partition: 0,
            end_partition: meta.partitions,
            ready: VecDeque::new(),
            failed: false,
            prefer: None,
            prefer_ok: None,
            restarts: 0,
        })
    }

    /// The `k` items of `table` with the largest (`largest`) or smallest values of column
    /// `column` (component of a vector; 0 for scalars) among those `predicate` selects, best
    /// first, equal values by key bytes (smaller first). Values are the column's as f64.
    #[expect(clippy::too_many_arguments, reason = "the operator's parameters")]
    pub fn top_k(
        &self,
        table: &str,
        version: u32,
        incarnation: u64,
        column: u32,
        k: u32,
        largest: bool,
        predicate: Option<Predicate>,
    ) -> Result<(TopItems, u32)> {
        if k == 0 {
            return Err(Error::InvalidArgument("k must be at least 1".into()));
        }
        let spec = OpSpec::TopK {
            column,
            k,
            largest,
            predicate,
        };
        let a = self.run_op(table, version, incarnation, &spec)?;
        match a.result {
            OpResult::TopK(items) => Ok((items, a.version)),
            other => Err(Error::Protocol {
                server: String::new(),
                message: format!("top_k answered {other:?}"),
            }),
        }
    }
}

impl Scan {
    /// Narrows the scan to partitions `start..end` (a job's task reads one partition). Refused
    /// when the range is empty or passes the table's partition count.
    pub fn partitions(mut self, start: u32, end: u32) -> Result<Scan> {
        if start >= end || end > self.meta.partitions {
            return Err(Error::InvalidArgument(format!(
                "partitions {start}..{end} are not a non-empty range within the table's {}",
                self.meta.partitions
            )));
        }
        self.next_partition = start;
        self.end_partition = end;
        Ok(self)
    }

    /// Asks each partition of server `addr` ("host:port", a member of the cluster) first where it
    /// is one of the partition's replicas: a job's task placed beside that server reads its
    /// partition there. Only where every replica holds the data ([`Client::read_pick`] would
    /// spread the read: a pinned version confirmed sealed, or a client writing with `ack = all`);
    /// otherwise the scan asks the primary first, as without it. Failover is unchanged: a
    /// preferred server that is down, slow, repairing or not a replica of the partition is passed
    /// over for the next replica. Refused when `addr` is not a server of the cluster (as the
    /// servers' spec has it: a client that does not know the server yet, one added since it was
    /// made, asks for the spec first).
    pub fn prefer(mut self, addr: &str) -> Result<Scan> {
        let known = |c: &Client| c.topology().pools.iter().any(|p| p.addr == addr);
        if !known(&self.client) {
            // A failed refresh leaves the view as it was: the refusal below then stands.
            let _ = self.client.refresh_spec();
        }
        if !known(&self.client) {
            return Err(Error::InvalidArgument(format!(
                "prefer={addr:?} is not a server of the cluster"
            )));
        }
        self.prefer = Some(addr.to_string());
        Ok(self)
    }

    /// The version read (0 until the first page resolved it).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The table's value type.
    pub fn value_type(&self) -> ValueType {
        self.meta.value_type
    }

    /// Reads partition `p` whole (restarting it when it changes), as chunks.
    fn read_partition(&mut self, p: u32) -> Result<Vec<Chunk>> {
        let mut restarts = 0;
        'again: loop {
            let mut chunks = Vec::new();
            let mut cursor = Cursor::START;
            loop {
                let (state, next, generation) = self.page(p, cursor, &mut chunks)?;
                match state {
                    PageState::Changed => {
                        restarts += 1;
                        self.restarts += 1;
                        if restarts > self.opts.max_restarts {
                            return Err(Error::PartitionsUnavailable {
                                partitions: vec![p],
                                detail: format!(
                                    "partition {p} of {} changed between the pages of its scan {restarts} times in a row (written too often to read one moment of it)",
                                    self.table
                                ),
                            });
                        }
                        continue 'again;
                    }
                    PageState::Done => return Ok(chunks),
                    PageState::More => {
                        cursor = Cursor {
                            position: next,
                            generation,
                        }
                    }
                }
            }
        }
    }

    /// Asks one page (retrying refusals under a refreshed spec), appending its items.
    fn page(
        &mut self,
        p: u32,
        cursor: Cursor,
        chunks: &mut Vec<Chunk>,
    ) -> Result<(PageState, u64, u64)> {
        let c = self.client.clone();
        let max_bytes = u32::try_from((c.max_body() / 2).min(64 << 20)).unwrap_or(u32::MAX);
        let mut attempt = 0u32;
        loop {
            let topo = c.topology();
            let map = topo.map(&self.meta);
            let req = ScanRequest {
                table: &self.table,
                version: self.version,
                epoch: map.epoch(),
                incarnation: self.incarnation,
                partition: p,
                cursor,
                max_items: u32::MAX,
                max_bytes,
                predicate: self.predicate,
            };
            let mut encode = |_s: usize, _parts: &[u32], buf: &mut Vec<u8>, id: u64| {
                encode_scan(buf, id, &req).map_err(encode_err)
            };
            let mut got: Option<(PageState, u64, u64, u32)> = None;
            let (version, vt, per) = (self.version, self.meta.value_type, self.opts.chunk_items);
            let mut take = |s: usize, _parts: &[u32], done: &[bool], resp: Response<'_>| {
                let addr = &topo.pools[s].addr;
                let Response::Scan(r) = resp else {
                    return Ok(Handled::Failed(unexpected(addr, &resp)));
                };
                let h = &r.head;
                if h.partition != p
                    || h.value_type != vt
                    || (version != 0 && h.version != version)
                    || (cursor.generation != 0
                        && h.state != PageState::Changed
                        && h.generation != cursor.generation)
                {
                    return Ok(Handled::Failed(Error::Protocol {
                        server: addr.clone(),
                        message: "SCAN page does not answer the page asked".into(),
                    }));
                }
                if done.get(p as usize).copied().unwrap_or(false) {
                    return Ok(Handled::Ok);
                }
                if h.state != PageState::Changed {
                    Chunk::append(chunks, &r, per);
                }
                got = Some((h.state, h.next, h.generation, h.version));
                Ok(Handled::Ok)
            };
            // Every page of a partition goes to the same replica (a page from another would be
            // answered CHANGED): the pick depends on the partition and the table only.
            let server = self
                .prefer
                .as_ref()
                .and_then(|addr| topo.pools.iter().position(|s| &s.addr == addr));
            let pick = match server {
                // Not asked for, or no longer a member (the spec changed): today's rule.
                None => Pick::Primary,
                Some(server) => {
                    let ok = *self.prefer_ok.get_or_insert_with(|| {
                        c.prefer_pick(&self.table, self.version, server) != Pick::Primary
                    });
                    if ok {
                        Pick::Prefer(server)
                    } else {
                        Pick::Primary
                    }
                }
            };
            let io = RoundIo {
                opcode: Opcode::Scan,
                hedge: false,
                pick,
                keys_in: &|_| 1,
                encode: &mut encode,
                take: &mut take,
            };
            match c.partition_round(&topo, &map, &self.table, self.version, vec![p], io) {
                Ok(()) => {
                    let (state, next, generation, version) =
                        got.ok_or_else(|| Error::Protocol {
                            server: String::new(),
                            message: format!("no page of partition {p} came back"),
                        })?;
                    self.version = version;
                    return Ok((state, next, generation));
                }
                Err(OpError::Stale(s, why)) => {
                    if attempt >= c.inner.spec_retries {
                        return Err(Error::PartitionsUnavailable {
                            partitions: vec![p],
                            detail: format!(
                                "a scan of {} was refused after {attempt} refreshes of the cluster spec: {why}",
                                self.table
                            ),
                        });
                    }
                    attempt += 1;
                    crate::client::stale_backoff(attempt);
                    c.on_stale(&topo, s, &self.table)?;
                    let meta = c.table_meta(&self.table)?;
                    if meta.incarnation != self.incarnation {
                        return Err(Error::TableNotFound(format!(
                            "{} (dropped and created again during a scan)",
                            self.table
                        )));
                    }
                }
                Err(OpError::Fatal(Error::TableNotFound(t))) => {
                    c.inner.tables.write().remove(&self.table);
                    return Err(Error::TableNotFound(t));
                }
                Err(OpError::Fatal(e)) => return Err(e),
            }
        }
    }
}

impl Iterator for Scan {
    type Item = Result<Chunk>;

    fn next(&mut self) -> Option<Result<Chunk>> {
        loop {
            if let Some(c) = self.ready.pop_front() {
                return Some(Ok(c));
            }
            if self.failed || self.next_partition >= self.end_partition {
                return None;
            }
            let p = self.next_partition;
            match self.read_partition(p) {
                Ok(chunks) => {
                    self.next_partition += 1;
                    self.ready.extend(chunks);
                }
                Err(e) => {
                    self.failed = true;
                    return Some(Err(e));
                }
            }
        }
    }
}
