//! Metrics: the native protocol's counters (server-wide and per table), and their Prometheus text
//! exposition, served over HTTP by `--metrics ADDR` (the listener is `http.rs`) and returned by the
//! native METRICS opcode.
//!
//! Invariants relied on:
//! 1. Every counter here lives in a [`WorkerStats`] and is written only by that worker's thread
//!    (a worker is a single-threaded runtime), so a plain load + store is an increment (as
//!    `WorkerStats::add`). Readers sum the workers; a scrape never takes a lock a request needs
//!    except a worker's table map, which a connection locks only when it meets a table it has not
//!    counted yet (each connection keeps the counters of the last table it used).
//! 2. Counting happens once per native frame, never per key: a GET's hits are counted from the
//!    status bytes the store wrote for the reply.
//! 3. The HTTP endpoint runs on a thread of its own (`http.rs`), so a slow scraper never delays a
//!    worker.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use ramgrid_proto::native::{Request, Status};
use ramgrid_store::tables::KeyStatus;

use crate::node::Node;
use crate::stats::{Shared, WorkerStats};

/// Upper bounds of the batch latency histogram buckets, in seconds (`+Inf` follows).
pub const LATENCY_BUCKETS: [f64; 15] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5,
];
/// Refusal counters are indexed by the native status byte; statuses fit well below this.
const STATUS_SLOTS: usize = 32;
/// A worker counts at most this many table names; refusals naming further tables (which need
/// not exist) are counted server-wide only, so a client cannot grow the map without bound.
const MAX_TABLES_PER_WORKER: usize = 4096;

/// The data operations counted, in the order of the per-op arrays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// GET frames.
    Get = 0,
    /// PUT frames.
    Put = 1,
    /// DELETE frames.
    Delete = 2,
}

const OPS: [(Op, &str); 3] = [(Op::Get, "get"), (Op::Put, "put"), (Op::Delete, "delete")];

fn bump(counter: &AtomicU64, n: u64) {
    WorkerStats::add(counter, n);
}

/// A latency histogram: per-bucket counts (not cumulative), the last one `+Inf`.
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    sum_nanos: AtomicU64,
}

impl Histogram {
    fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let i = LATENCY_BUCKETS
            .iter()
            .position(|&b| secs <= b)
            .unwrap_or(LATENCY_BUCKETS.len());
        bump(&self.buckets[i], 1);
        bump(
            &self.sum_nanos,
            u64::try_from(d.as_nanos()).unwrap_or(u64::MAX),
        );
    }
}

/// Counters of native data requests: one set per worker for the whole server, and one per
/// worker per table.
#[derive(Debug, Default)]
pub struct NativeCounters {
    /// Frames per [`Op`], answered or refused.
    pub batches: [AtomicU64; 3],
    /// Keys asked by GET frames that were answered.
    pub gets: AtomicU64,
    /// Of those, keys found.
    pub hits: AtomicU64,
    /// Of those, keys not found (or refused one by one, as a key over the size limit).
    pub misses: AtomicU64,
    /// Keys PUT frames stored.
    pub puts: AtomicU64,
    /// Keys PUT frames refused one by one (wrong type, too large, no memory).
    pub put_failures: AtomicU64,
    /// Keys asked by DELETE frames that were answered.
    pub deletes: AtomicU64,
    /// Of those, keys that were there and are gone.
    pub delete_hits: AtomicU64,
    /// SCAN pages answered (a partition that fits one frame is one page): which replica served a
    /// job's scan.
    pub scan_pages: AtomicU64,
    /// Frames refused whole, by native status byte.
    pub refused: [AtomicU64; STATUS_SLOTS],
    /// Time from a frame's parse to its reply being ready (a log table's fsync included), per [`Op`].
    pub latency: [Histogram; 3],
}

impl NativeCounters {
    fn refuse(&self, status: Status) {
        bump(&self.refused[(status as usize).min(STATUS_SLOTS - 1)], 1);
    }

    fn count(&self, op: Op, status: &[u8], refused: Option<Status>, elapsed: Duration) {
        bump(&self.batches[op as usize], 1);
        self.latency[op as usize].observe(elapsed);
        if let Some(s) = refused {
            self.refuse(s);
            return;
        }
        let n = status.len() as u64;
        let ok = status.iter().filter(|&&s| s == KeyStatus::Ok as u8).count() as u64;
        match op {
            Op::Get => {
                bump(&self.gets, n);
                bump(&self.hits, ok);
                bump(&self.misses, n - ok);
            }
            Op::Put => {
                bump(&self.puts, ok);
                bump(&self.put_failures, n - ok);
            }
            Op::Delete => {
                bump(&self.deletes, n);
                bump(&self.delete_hits, ok);
            }
        }
    }
}

/// One worker's per-table counters, by table name.
#[derive(Debug, Default)]
pub struct TableCounters {
    map: Mutex<HashMap<String, Arc<NativeCounters>>>,
}

/// What a native connection keeps between frames: the counters of the table it used last.
#[derive(Debug, Default)]
pub struct ConnMetrics {
    last: Option<(String, Arc<NativeCounters>)>,
}

impl ConnMetrics {
    fn table(
        &mut self,
        stats: &WorkerStats,
        name: &str,
        create: bool,
    ) -> Option<Arc<NativeCounters>> {
        if let Some((n, c)) = &self.last {
            if n == name {
                return Some(c.clone());
            }
        }
        let mut map = stats.tables.map.lock();
        let c = match map.get(name) {
            Some(c) => c.clone(),
            None if create && map.len() < MAX_TABLES_PER_WORKER => {
                map.entry(name.to_owned()).or_default().clone()
            }
            None => return None,
        };
        drop(map);
        self.last = Some((name.to_owned(), c.clone()));
        Some(c)
    }

    /// Counts one native frame: `status` holds the per-key statuses of an answered data request,
    /// `refused` the status of a request refused whole, `started` when its handling began.
    pub fn record(
        &mut self,
        stats: &WorkerStats,
        req: &Request<'_>,
        status: &[u8],
        refused: Option<Status>,
        started: Instant,
    ) {
        let (op, table) = match req {
            Request::Get(b) => (Op::Get, b.table),
            Request::Put(p) => (Op::Put, p.table),
            Request::Delete(b) => (Op::Delete, b.table),
            Request::Scan(q) if refused.is_none() => {
                bump(&stats.native.scan_pages, 1);
                if let Some(t) = self.table(stats, q.table, true) {
                    bump(&t.scan_pages, 1);
                }
                return;
            }
            _ => {
                if let Some(s) = refused {
                    stats.native.refuse(s);
                }
                return;
            }
        };
        let elapsed = started.elapsed();
        stats.native.count(op, status, refused, elapsed);
        // A table that does not exist (or a client not yet authenticated) gets no entry.
        let create = !matches!(
            refused,
            Some(Status::NoSuchTable | Status::AuthRequired | Status::AuthFailed)
        );
        if let Some(t) = self.table(stats, table, create) {
            t.count(op, status, refused, elapsed);
        }
    }
}

/// Where the METRICS opcode finds the server-wide state (set once, when the server starts).
#[derive(Default)]
pub struct Hook(OnceLock<Arc<Shared>>);

impl Hook {
    /// Called once by `server::start`.
    pub fn set(&self, shared: Arc<Shared>) {
        let _ = self.0.set(shared);
    }

    /// The exposition text, or `None` before the server has started.
    pub fn render(&self, node: &Node) -> Option<String> {
        self.0.get().map(|s| render(s, node))
    }
}

impl std::fmt::Debug for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("metrics::Hook")
    }
}

/// Refuses an HTTP address that other hosts could reach unless the server has a token (there,
/// `/metrics` and the dashboard then require it: [`metrics_allowed`]) or `--insecure-no-auth`
/// says so (`/metrics` open to all; the dashboard stays shut without a token).
pub fn check_addr(addr: SocketAddr, token: bool, insecure_no_auth: bool) -> Result<(), String> {
    if addr.ip().is_loopback() || token || insecure_no_auth {
        return Ok(());
    }
    Err(format!(
        "refusing to serve metrics on non-loopback address {addr} without a token: pass --token \
         (the metrics and the dashboard then require it there), use a loopback address (and a \
         proxy), or pass --insecure-no-auth to let anyone read the metrics"
    ))
}

/// Whether a `/metrics` request may be answered: on a loopback listener always (a local scraper
/// needs nothing); on another one, when the server has a token, only with `presented` equal to it.
pub fn metrics_allowed(token: Option<&str>, presented: Option<&str>, bind: SocketAddr) -> bool {
    match token {
        _ if bind.ip().is_loopback() => true,
        // Only with --insecure-no-auth (check_addr).
        None => true,
        Some(t) => presented.is_some_and(|p| crate::auth::token_matches(p.as_bytes(), t)),
    }
}

// --- exposition ---------------------------------------------------------------------------------

/// Escapes a label value (exposition format 0.0.4: backslash, double quote, newline).
fn label(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

struct Out(String);

impl Out {
    fn head(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn one(&mut self, name: &str, labels: &str, v: u64) {
        if labels.is_empty() {
            let _ = writeln!(self.0, "{name} {v}");
        } else {
            let _ = writeln!(self.0, "{name}{{{labels}}} {v}");
        }
    }

    fn metric(&mut self, name: &str, kind: &str, help: &str, v: u64) {
        self.head(name, kind, help);
        self.one(name, "", v);
    }
}

/// Sums of one worker-set of counters (the server's, or one table's).
#[derive(Default)]
struct Sums {
    batches: [u64; 3],
    gets: u64,
    hits: u64,
    misses: u64,
    puts: u64,
    put_failures: u64,
    deletes: u64,
    delete_hits: u64,
    scan_pages: u64,
    refused: [u64; STATUS_SLOTS],
    buckets: [[u64; LATENCY_BUCKETS.len() + 1]; 3],
    sum_nanos: [u64; 3],
}

impl Sums {
    fn add(&mut self, c: &NativeCounters) {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        for i in 0..3 {
            self.batches[i] += l(&c.batches[i]);
            for (b, a) in self.buckets[i].iter_mut().zip(&c.latency[i].buckets) {
                *b += l(a);
            }
            self.sum_nanos[i] += l(&c.latency[i].sum_nanos);
        }
        self.gets += l(&c.gets);
        self.hits += l(&c.hits);
        self.misses += l(&c.misses);
        self.puts += l(&c.puts);
        self.put_failures += l(&c.put_failures);
        self.deletes += l(&c.deletes);
        self.delete_hits += l(&c.delete_hits);
        self.scan_pages += l(&c.scan_pages);
        for (r, a) in self.refused.iter_mut().zip(&c.refused) {
            *r += l(a);
        }
    }
}

/// The counter families shared by the server-wide and the per-table series: `prefix` is
/// `ramgrid_native` or `ramgrid_table`, `rows` one label set (`table="t"` or empty) per sum.
fn write_counters(out: &mut Out, prefix: &str, rows: &[(String, Sums)]) {
    let sep = |l: &str| {
        if l.is_empty() {
            String::new()
        } else {
            format!("{l},")
        }
    };
    type Family = (&'static str, &'static str, fn(&Sums) -> u64);
    let fams: [Family; 8] = [
        ("gets_total", "keys asked by answered GET frames", |s| {
            s.gets
        }),
        ("hits_total", "keys GET frames found", |s| s.hits),
        ("misses_total", "keys GET frames did not find", |s| s.misses),
        ("puts_total", "keys PUT frames stored", |s| s.puts),
        (
            "put_failures_total",
            "keys PUT frames refused one by one",
            |s| s.put_failures,
        ),
        (
            "deletes_total",
            "keys asked by answered DELETE frames",
            |s| s.deletes,
        ),
        ("delete_hits_total", "keys DELETE frames removed", |s| {
            s.delete_hits
        }),
        ("scan_pages_total", "SCAN pages answered", |s| s.scan_pages),
    ];
    for (suffix, help, pick) in fams {
        let name = format!("{prefix}_{suffix}");
        out.head(&name, "counter", help);
        for (l, s) in rows {
            out.one(&name, l, pick(s));
        }
    }
    let name = format!("{prefix}_batches_total");
    out.head(
        &name,
        "counter",
        "data frames (GET, PUT, DELETE), answered or refused",
    );
    for (l, s) in rows {
        for (op, opname) in OPS {
            out.one(
                &name,
                &format!("{}op=\"{opname}\"", sep(l)),
                s.batches[op as usize],
            );
        }
    }
    let name = format!("{prefix}_refused_total");
    out.head(
        &name,
        "counter",
        "data frames refused whole, by reason (statuses seen so far)",
    );
    for (l, s) in rows {
        for (i, &n) in s.refused.iter().enumerate() {
            let reason = u8::try_from(i).ok().and_then(Status::from_u8);
            if n > 0 {
                let reason = reason.map_or("UNKNOWN", Status::name);
                out.one(&name, &format!("{}reason=\"{reason}\"", sep(l)), n);
            }
        }
    }
    let name = format!("{prefix}_batch_seconds");
    out.head(
        &name,
        "histogram",
        "time from a data frame's parse to its reply (log fsync included)",
    );
    for (l, s) in rows {
        for (op, opname) in OPS {
            let i = op as usize;
            let base = format!("{}op=\"{opname}\"", sep(l));
            let mut cum = 0;
            for (b, le) in LATENCY_BUCKETS.iter().enumerate() {
                cum += s.buckets[i][b];
                let _ = writeln!(out.0, "{name}_bucket{{{base},le=\"{le}\"}} {cum}");
            }
            cum += s.buckets[i][LATENCY_BUCKETS.len()];
            let _ = writeln!(out.0, "{name}_bucket{{{base},le=\"+Inf\"}} {cum}");
            let _ = writeln!(
                out.0,
                "{name}_sum{{{base}}} {}",
                s.sum_nanos[i] as f64 / 1e9
            );
            let _ = writeln!(out.0, "{name}_count{{{base}}} {cum}");
        }
    }
}

/// The whole exposition (text format 0.0.4): server-wide figures, then one series per table
/// this server has.
pub fn render(shared: &Shared, node: &Node) -> String {
    let mut out = Out(String::with_capacity(16 << 10));
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let sum = |pick: fn(&WorkerStats) -> &AtomicU64| shared.sum(pick);
    let cache = shared.cache.stats();
    out.metric(
        "ramgrid_uptime_seconds",
        "gauge",
        "seconds since the server started",
        shared.started.elapsed().as_secs(),
    );
    out.metric(
        "ramgrid_connections",
        "gauge",
        "open client connections, both protocols",
        load(&shared.curr_connections),
    );
    out.metric(
        "ramgrid_connections_total",
        "counter",
        "client connections accepted",
        load(&shared.total_connections),
    );
    out.metric(
        "ramgrid_connections_rejected_total",
        "counter",
        "connections refused at --max-conns",
        load(&shared.rejected_connections),
    );
    out.metric(
        "ramgrid_tls_handshake_failures_total",
        "counter",
        "connections closed for TLS: a failed or timed-out handshake, or a TLS client on a plain port",
        sum(|w| &w.tls_handshake_failures),
    );
    out.metric(
        "ramgrid_bytes_read_total",
        "counter",
        "bytes read from clients, both protocols",
        sum(|w| &w.bytes_read),
    );
    out.metric(
        "ramgrid_bytes_written_total",
        "counter",
        "bytes written to clients, both protocols",
        sum(|w| &w.bytes_written),
    );
    // The memcached keyspace: the same figures as `stats` (docs/protocol.md, section 5).
    out.metric(
        "ramgrid_memcached_items",
        "gauge",
        "items in the memcached keyspace",
        cache.curr_items,
    );
    out.metric(
        "ramgrid_memcached_bytes",
        "gauge",
        "bytes the memcached keyspace's items cost",
        cache.bytes,
    );
    out.metric(
        "ramgrid_memcached_limit_bytes",
        "gauge",
        "the memcached keyspace's memory limit (--memory)",
        cache.limit_maxbytes,
    );
    out.metric(
        "ramgrid_memcached_evictions_total",
        "counter",
        "items evicted to make room",
        cache.evictions,
    );
    out.metric(
        "ramgrid_memcached_reclaimed_total",
        "counter",
        "expired items removed",
        cache.expired,
    );
    out.metric(
        "ramgrid_memcached_gets_total",
        "counter",
        "keys asked by get, gets and mg",
        sum(|w| &w.cmd_get),
    );
    out.metric(
        "ramgrid_memcached_hits_total",
        "counter",
        "of those, keys found",
        sum(|w| &w.get_hits),
    );
    out.metric(
        "ramgrid_memcached_misses_total",
        "counter",
        "of those, keys not found",
        sum(|w| &w.get_misses),
    );
    out.metric(
        "ramgrid_memcached_sets_total",
        "counter",
        "storage commands and ms that reached the store",
        sum(|w| &w.cmd_set),
    );
    out.metric(
        "ramgrid_memcached_delete_hits_total",
        "counter",
        "delete and md that removed an item",
        sum(|w| &w.delete_hits),
    );
    out.metric(
        "ramgrid_memcached_delete_misses_total",
        "counter",
        "delete and md that found nothing",
        sum(|w| &w.delete_misses),
    );
    let log = &crate::wal::STATS;
    out.metric(
        "ramgrid_log_commits_total",
        "counter",
        "native writes to log tables that waited for their log",
        load(&log.commits),
    );
    out.metric(
        "ramgrid_log_syncs_total",
        "counter",
        "fdatasyncs of table logs",
        load(&log.syncs),
    );

    let mut server = Sums::default();
    for w in &shared.workers {
        server.add(&w.native);
    }
    write_counters(&mut out, "ramgrid_native", &[(String::new(), server)]);

    let mut rows = Vec::new();
    let infos: Vec<_> = node
        .tables
        .list()
        .into_iter()
        .filter_map(|n| node.tables.describe(&n).ok())
        .collect();
    out.head(
        "ramgrid_table_versions",
        "gauge",
        "versions of the table this server has",
    );
    for t in &infos {
        out.one(
            "ramgrid_table_versions",
            &format!("table=\"{}\"", label(&t.spec.name)),
            t.versions.len() as u64,
        );
    }
    out.head(
        "ramgrid_table_current_version",
        "gauge",
        "the version readers get (0: none)",
    );
    for t in &infos {
        out.one(
            "ramgrid_table_current_version",
            &format!("table=\"{}\"", label(&t.spec.name)),
            u64::from(t.current),
        );
    }
    for (name, help, pick) in [
        (
            "ramgrid_table_items",
            "live keys of a version over the partitions held here",
            (|v| v.items) as fn(&ramgrid_store::tables::VersionInfo) -> u64,
        ),
        (
            "ramgrid_table_bytes",
            "bytes a version's keys and values use here",
            |v| v.bytes,
        ),
    ] {
        out.head(name, "gauge", help);
        for t in &infos {
            for v in &t.versions {
                out.one(
                    name,
                    &format!("table=\"{}\",version=\"{}\"", label(&t.spec.name), v.number),
                    pick(v),
                );
            }
        }
    }
    for t in &infos {
        let mut s = Sums::default();
        for w in &shared.workers {
            if let Some(c) = w.tables.map.lock().get(&t.spec.name).cloned() {
                s.add(&c);
            }
        }
        rows.push((format!("table=\"{}\"", label(&t.spec.name)), s));
    }
    write_counters(&mut out, "ramgrid_table", &rows);
    // The control plane (docs/control-plane.md).
    if let Some(meta) = node.meta.get() {
        for (name, kind, help, v) in meta.figures() {
            out.metric(name, kind, help, v);
        }
    }
    // Replicas compared by the primaries (docs/replication.md).
    for (name, kind, help, v) in node.replica_checks.figures() {
        out.metric(name, kind, help, v);
    }
    out.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_loopback_the_token_guards_the_metrics() {
        let lo: SocketAddr = "127.0.0.1:9100".parse().unwrap();
        let all: SocketAddr = "0.0.0.0:9100".parse().unwrap();
        assert!(check_addr(lo, false, false).is_ok());
        assert!(check_addr(all, false, false)
            .unwrap_err()
            .contains("--token"));
        assert!(check_addr(all, true, false).is_ok());
        assert!(check_addr(all, false, true).is_ok());
        assert!(metrics_allowed(Some("t"), None, lo));
        assert!(metrics_allowed(None, None, all), "--insecure-no-auth");
        assert!(!metrics_allowed(Some("t"), None, all));
        assert!(!metrics_allowed(Some("t"), Some("u"), all));
        assert!(metrics_allowed(Some("t"), Some("t"), all));
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn a_histogram_puts_each_duration_in_its_bucket() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(10));
        h.observe(Duration::from_micros(50));
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_secs(10));
        let counts: Vec<u64> = h
            .buckets
            .iter()
            .map(|a| a.load(Ordering::Relaxed))
            .collect();
        assert_eq!(counts[0], 2, "<= 50 us");
        assert_eq!(counts[6], 1, "<= 5 ms");
        assert_eq!(counts[LATENCY_BUCKETS.len()], 1, "+Inf");
        assert_eq!(counts.iter().sum::<u64>(), 4);
    }

    #[test]
    fn counting_a_get_splits_hits_and_misses() {
        let c = NativeCounters::default();
        c.count(Op::Get, &[0, 1, 0, 2], None, Duration::ZERO);
        c.count(Op::Put, &[0, 0, 4], None, Duration::ZERO);
        c.count(Op::Delete, &[0, 1], None, Duration::ZERO);
        c.count(Op::Get, &[], Some(Status::NotOwner), Duration::ZERO);
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        assert_eq!((l(&c.gets), l(&c.hits), l(&c.misses)), (4, 2, 2));
        assert_eq!((l(&c.puts), l(&c.put_failures)), (2, 1));
        assert_eq!((l(&c.deletes), l(&c.delete_hits)), (2, 1));
        assert_eq!(l(&c.batches[Op::Get as usize]), 2);
        assert_eq!(l(&c.refused[Status::NotOwner as usize]), 1);
    }
}
