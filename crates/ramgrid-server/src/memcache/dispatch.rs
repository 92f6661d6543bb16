//! Adapts parsed memcached requests to store calls and composes the replies, byte for byte as
//! memcached 1.6.18 does (see `docs/protocol.md` for each command and the few deliberate
//! differences).
//!
//! CONTRACT (fixed): the connection loop calls [`execute_part`] for each parsed request, which
//! appends the reply to `out`, and calls it again after writing `out` out for as long as it answers
//! [`Flow::Partial`] (a multi-key get whose reply passed [`REPLY_HIGH_WATER`]). Replies are written
//! straight into `out`: a multi-key get allocates nothing per key.

use std::sync::atomic::Ordering;
use std::time::{SystemTime, UNIX_EPOCH};

use ramgrid_proto::memcache::reply::{
    self, push_u64, write_meta_flag_i64, write_meta_flag_u64, write_meta_key, write_value,
};
use ramgrid_proto::memcache::{Keys, Meta, MetaFlags, Request, Store, StoreMode};
use ramgrid_store::{
    ArithOutcome, Cache, DeleteOutcome, ErrorKind, GetHit, GetOptions, SetMode, StoreOutcome,
};

use crate::stats::{Shared, WorkerStats};

/// What the connection does after a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Keep going.
    Continue,
    /// Flush `out` and close (quit).
    Close,
    /// The reply is not complete: write `out` out, then call [`execute_part`] again with the same
    /// request and progress.
    Partial,
}

/// A multi-key get stops composing its reply once this much is pending in `out`, so that the
/// connection writes it out first: a get of many large values never holds more than this plus
/// [`GET_CHUNK`] values in memory, and a client that stops reading stalls it there.
pub const REPLY_HIGH_WATER: usize = 256 << 10;

/// Keys a multi-key get looks up between checks of [`REPLY_HIGH_WATER`] (the store's prefetch
/// group).
const GET_CHUNK: usize = 16;

/// The version we report. Clients only look at the `VERSION ` prefix.
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "-ramgrid");

/// memcached caps `verbosity` at this level.
const MAX_VERBOSITY: u32 = 2;

/// Executes one request against the store, appending its whole reply (if any) to `out`.
pub fn execute(req: &Request<'_>, shared: &Shared, stats: &WorkerStats, out: &mut Vec<u8>) -> Flow {
    let mut progress = 0;
    loop {
        match execute_part(req, shared, stats, out, &mut progress) {
            Flow::Partial => continue,
            flow => return flow,
        }
    }
}

/// Executes one request against the store, appending its reply (if any) to `out`, or the next
/// part of it: see [`Flow::Partial`]. `progress` starts at 0 for each request and is kept between
/// the parts.
pub fn execute_part(
    req: &Request<'_>,
    shared: &Shared,
    stats: &WorkerStats,
    out: &mut Vec<u8>,
    progress: &mut usize,
) -> Flow {
    let cache = &shared.cache;
    match req {
        Request::Get { keys, with_cas } => {
            return get(cache, keys, None, *with_cas, stats, out, progress);
        }
        Request::Gat {
            exptime,
            keys,
            with_cas,
        } => return get(cache, keys, Some(*exptime), *with_cas, stats, out, progress),
        Request::Store(store) => store_text(cache, store, stats, out),
        Request::Delete { key, noreply } => {
            let reply = match cache.delete(key, None, false) {
                DeleteOutcome::Deleted => {
                    WorkerStats::add(&stats.delete_hits, 1);
                    reply::DELETED
                }
                DeleteOutcome::NotFound => {
                    WorkerStats::add(&stats.delete_misses, 1);
                    reply::NOT_FOUND
                }
                DeleteOutcome::Exists => reply::EXISTS,
            };
            unless_noreply(out, *noreply, reply);
        }
        Request::Arith {
            key,
            delta,
            incr,
            noreply,
        } => arith_text(cache, key, *delta, *incr, *noreply, stats, out),
        Request::Touch {
            key,
            exptime,
            noreply,
        } => {
            WorkerStats::add(&stats.cmd_touch, 1);
            let reply = if cache.touch(key, cache.exptime_from_protocol(*exptime)) {
                WorkerStats::add(&stats.touch_hits, 1);
                reply::TOUCHED
            } else {
                WorkerStats::add(&stats.touch_misses, 1);
                reply::NOT_FOUND
            };
            unless_noreply(out, *noreply, reply);
        }
        Request::FlushAll { delay, noreply } => {
            WorkerStats::add(&stats.cmd_flush, 1);
            let reply = if shared.settings.flush_enabled {
                let at = match delay {
                    Some(d) if *d > 0 => cache.exptime_from_protocol(*d),
                    _ => 0,
                };
                cache.flush_all(at);
                reply::OK
            } else {
                reply::FLUSH_NOT_ALLOWED
            };
            unless_noreply(out, *noreply, reply);
        }
        Request::Stats { arg } => stats_reply(shared, *arg, out),
        Request::Version => {
            out.extend_from_slice(b"VERSION ");
            out.extend_from_slice(VERSION.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        Request::Verbosity { level, noreply } => {
            shared
                .verbosity
                .store((*level).min(MAX_VERBOSITY), Ordering::Relaxed);
            unless_noreply(out, *noreply, reply::OK);
        }
        Request::Quit => return Flow::Close,
        Request::MetaGet(meta) => meta_get(cache, meta, stats, out),
        Request::MetaSet { meta, data } => meta_set(cache, meta, data, stats, out),
        Request::MetaDelete(meta) => meta_delete(cache, meta, stats, out),
        Request::MetaArith(meta) => meta_arith(cache, meta, stats, out),
        Request::MetaNoop => out.extend_from_slice(reply::MN),
        Request::MetaDebug { key } => meta_debug(cache, &key.bytes(), key.base64, out),
        // A request kind this dispatcher does not know yet.
        _ => out.extend_from_slice(reply::ERROR),
    }
    Flow::Continue
}

fn unless_noreply(out: &mut Vec<u8>, noreply: bool, reply: &[u8]) {
    if !noreply {
        out.extend_from_slice(reply);
    }
}

// --- text protocol ------------------------------------------------------------------------------

/// get/gets, and with `touch` gat/gats, which count as touches, not gets (as in memcached).
fn get(
    cache: &Cache,
    keys: &Keys<'_>,
    touch: Option<i64>,
    with_cas: bool,
    stats: &WorkerStats,
    out: &mut Vec<u8>,
    progress: &mut usize,
) -> Flow {
    let exptime = touch.map(|t| cache.exptime_from_protocol(t));
    let (asked, hits, flow) = get_values(cache, keys, exptime, with_cas, out, progress);
    let (cmd, hit, miss) = match touch {
        None => (&stats.cmd_get, &stats.get_hits, &stats.get_misses),
        Some(_) => (&stats.cmd_touch, &stats.touch_hits, &stats.touch_misses),
    };
    WorkerStats::add(cmd, asked);
    WorkerStats::add(hit, hits);
    WorkerStats::add(miss, asked - hits);
    flow
}

/// The VALUE lines of a multi-key get (with `touch`: gat) from key number `progress` on, then
/// `END`; or, once the reply passes [`REPLY_HIGH_WATER`], only up to there ([`Flow::Partial`]).
/// Returns the keys looked up and the hits among them.
fn get_values(
    cache: &Cache,
    keys: &Keys<'_>,
    touch: Option<u32>,
    with_cas: bool,
    out: &mut Vec<u8>,
    progress: &mut usize,
) -> (u64, u64, Flow) {
    let mut rest = keys.iter().skip(*progress);
    let (mut asked, mut hits) = (0usize, 0usize);
    loop {
        let mut taken = 0;
        let chunk = rest.by_ref().take(GET_CHUNK).inspect(|_| taken += 1);
        hits += cache.get_many(chunk, touch, |_, it| {
            write_value(out, it.key, it.flags, it.value, with_cas.then_some(it.cas))
        });
        asked += taken;
        if taken < GET_CHUNK {
            out.extend_from_slice(reply::END);
            return (asked as u64, hits as u64, Flow::Continue);
        }
        if out.len() >= REPLY_HIGH_WATER {
            *progress += asked;
            return (asked as u64, hits as u64, Flow::Partial);
        }
    }
}

fn set_mode(mode: StoreMode) -> SetMode {
    match mode {
        StoreMode::Set => SetMode::Set,
        StoreMode::Add => SetMode::Add,
        StoreMode::Replace => SetMode::Replace,
        StoreMode::Append => SetMode::Append,
        StoreMode::Prepend => SetMode::Prepend,
        StoreMode::Cas(unique) => SetMode::Cas(unique),
    }
}

/// The reply to a failed write. Unlike memcached, which then drops the old item, ramgrid keeps
/// it: a refused write loses no data, the same as when the parser refuses an oversized value.
fn store_failed(kind: ErrorKind) -> &'static [u8] {
    match kind {
        ErrorKind::TooLarge => reply::TOO_LARGE,
        _ => reply::OUT_OF_MEMORY_STORING,
    }
}

fn count_cas(stats: &WorkerStats, outcome: StoreOutcome) {
    let counter = match outcome {
        StoreOutcome::Stored(_) => &stats.cas_hits,
        StoreOutcome::Exists => &stats.cas_badval,
        StoreOutcome::NotFound => &stats.cas_misses,
        StoreOutcome::NotStored => return,
    };
    WorkerStats::add(counter, 1);
}

fn store_text(cache: &Cache, s: &Store<'_>, stats: &WorkerStats, out: &mut Vec<u8>) {
    let mode = set_mode(s.mode);
    let exptime = cache.exptime_from_protocol(s.exptime);
    let reply = match cache.store(mode, s.key, s.data, s.flags, exptime, None) {
        Ok(outcome) => {
            WorkerStats::add(&stats.cmd_set, 1);
            if matches!(mode, SetMode::Cas(_)) {
                count_cas(stats, outcome);
            }
            match outcome {
                StoreOutcome::Stored(_) => reply::STORED,
                StoreOutcome::NotStored => reply::NOT_STORED,
                StoreOutcome::Exists => reply::EXISTS,
                StoreOutcome::NotFound => reply::NOT_FOUND,
            }
        }
        Err(e) => store_failed(e.kind()),
    };
    unless_noreply(out, s.noreply, reply);
}

fn arith_text(
    cache: &Cache,
    key: &[u8],
    delta: u64,
    incr: bool,
    noreply: bool,
    stats: &WorkerStats,
    out: &mut Vec<u8>,
) {
    let (hits, misses) = if incr {
        (&stats.incr_hits, &stats.incr_misses)
    } else {
        (&stats.decr_hits, &stats.decr_misses)
    };
    let start = out.len();
    match cache.arith(key, incr, delta, None, None) {
        Ok(ArithOutcome::Value(value, _)) => {
            WorkerStats::add(hits, 1);
            push_u64(out, value);
            out.extend_from_slice(b"\r\n");
        }
        Ok(ArithOutcome::NotFound) => {
            WorkerStats::add(misses, 1);
            out.extend_from_slice(reply::NOT_FOUND);
        }
        Ok(ArithOutcome::NonNumeric) => out.extend_from_slice(reply::NON_NUMERIC),
        Ok(ArithOutcome::Exists) => out.extend_from_slice(reply::EXISTS),
        Err(_) => out.extend_from_slice(reply::OUT_OF_MEMORY),
    }
    if noreply {
        out.truncate(start);
    }
}

// --- stats --------------------------------------------------------------------------------------

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// User and system CPU time of this process, as memcached prints them (`seconds.micros`).
fn rusage() -> [(i64, i64); 2] {
    // SAFETY: getrusage only writes the struct we pass, which is zeroed plain data.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut ru) != 0 {
            return [(0, 0); 2];
        }
        ru
    };
    [
        (ru.ru_utime.tv_sec, ru.ru_utime.tv_usec),
        (ru.ru_stime.tv_sec, ru.ru_stime.tv_usec),
    ]
}

fn write_stat_timeval(out: &mut Vec<u8>, name: &str, (secs, micros): (i64, i64)) {
    out.extend_from_slice(b"STAT ");
    out.extend_from_slice(name.as_bytes());
    out.push(b' ');
    push_u64(out, secs.max(0) as u64);
    out.push(b'.');
    let micros = micros.clamp(0, 999_999) as u64;
    let start = out.len();
    push_u64(out, micros + 1_000_000);
    // Six digits, zero-padded: drop the leading 1 of 1xxxxxx.
    out.remove(start);
    out.extend_from_slice(b"\r\n");
}

fn stats_reply(shared: &Shared, arg: Option<&[u8]>, out: &mut Vec<u8>) {
    match arg {
        None => general_stats(shared, out),
        Some(b"settings") => settings_stats(shared, out),
        // reset, items, slabs, sizes, conns, detail: not kept by ramgrid (see docs/protocol.md).
        Some(_) => {
            out.extend_from_slice(reply::ERROR);
            return;
        }
    }
    out.extend_from_slice(reply::END);
}

fn general_stats(shared: &Shared, out: &mut Vec<u8>) {
    use reply::{write_stat_str as s, write_stat_u64 as u};
    let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let sum = |pick: fn(&WorkerStats) -> &std::sync::atomic::AtomicU64| shared.sum(pick);
    let cache = shared.cache.stats();
    let [user, system] = rusage();
    u(out, "pid", u64::from(std::process::id()));
    u(out, "uptime", shared.started.elapsed().as_secs());
    u(out, "time", unix_now());
    s(out, "version", VERSION);
    u(out, "pointer_size", usize::BITS.into());
    write_stat_timeval(out, "rusage_user", user);
    write_stat_timeval(out, "rusage_system", system);
    u(out, "max_connections", shared.settings.max_conns as u64);
    u(out, "curr_connections", load(&shared.curr_connections));
    u(out, "total_connections", load(&shared.total_connections));
    u(
        out,
        "rejected_connections",
        load(&shared.rejected_connections),
    );
    u(out, "cmd_get", sum(|w| &w.cmd_get));
    u(out, "cmd_set", sum(|w| &w.cmd_set));
    u(out, "cmd_flush", sum(|w| &w.cmd_flush));
    u(out, "cmd_touch", sum(|w| &w.cmd_touch));
    u(out, "get_hits", sum(|w| &w.get_hits));
    u(out, "get_misses", sum(|w| &w.get_misses));
    u(out, "get_expired", cache.get_expired);
    u(out, "get_flushed", cache.get_flushed);
    u(out, "delete_misses", sum(|w| &w.delete_misses));
    u(out, "delete_hits", sum(|w| &w.delete_hits));
    u(out, "incr_misses", sum(|w| &w.incr_misses));
    u(out, "incr_hits", sum(|w| &w.incr_hits));
    u(out, "decr_misses", sum(|w| &w.decr_misses));
    u(out, "decr_hits", sum(|w| &w.decr_hits));
    u(out, "cas_misses", sum(|w| &w.cas_misses));
    u(out, "cas_hits", sum(|w| &w.cas_hits));
    u(out, "cas_badval", sum(|w| &w.cas_badval));
    u(out, "touch_hits", sum(|w| &w.touch_hits));
    u(out, "touch_misses", sum(|w| &w.touch_misses));
    u(out, "bytes_read", sum(|w| &w.bytes_read));
    u(out, "bytes_written", sum(|w| &w.bytes_written));
    u(out, "limit_maxbytes", cache.limit_maxbytes);
    u(out, "threads", shared.settings.threads as u64);
    u(out, "bytes", cache.bytes);
    u(out, "curr_items", cache.curr_items);
    u(out, "total_items", cache.total_items);
    u(out, "evictions", cache.evictions);
    u(out, "reclaimed", cache.expired);
    u(out, "crawler_reclaimed", cache.reclaimed);
    let log = &crate::wal::STATS;
    u(out, "log_commits", load(&log.commits));
    u(out, "log_syncs", load(&log.syncs));
    u(out, "log_bytes", load(&log.bytes));
}

fn settings_stats(shared: &Shared, out: &mut Vec<u8>) {
    use reply::{write_stat_str as s, write_stat_u64 as u};
    let settings = &shared.settings;
    u(out, "maxbytes", shared.cache.stats().limit_maxbytes);
    u(out, "maxconns", settings.max_conns as u64);
    u(
        out,
        "verbosity",
        u64::from(shared.verbosity.load(Ordering::Relaxed)),
    );
    u(out, "num_threads", settings.threads as u64);
    s(out, "cas_enabled", "yes");
    u(out, "item_size_max", settings.limits.max_value_len as u64);
    s(
        out,
        "flush_enabled",
        if settings.flush_enabled { "yes" } else { "no" },
    );
}

// --- meta protocol ------------------------------------------------------------------------------

/// A lookup that neither bumps the item nor marks it fetched.
///
/// NOTE: `Cache::get_with` hands out the win token of a stale or vivified item even with
/// `no_bump`; a side-effect-free peek needs a store option that does not exist yet.
fn peek<R>(cache: &Cache, key: &[u8], f: impl FnOnce(&GetHit<'_>) -> R) -> Option<R> {
    cache.get_with(
        key,
        GetOptions {
            no_bump: true,
            ..GetOptions::default()
        },
        f,
    )
}

/// Echoes the `O` and `k` return flags, in request order (the only ones a miss or a write
/// echoes besides `c`).
fn echo_opaque_and_key(out: &mut Vec<u8>, flags: &MetaFlags<'_>, key: &[u8], binary: bool) {
    for tok in flags.tokens() {
        match tok[0] {
            b'O' => {
                out.push(b' ');
                out.extend_from_slice(tok);
            }
            b'k' => write_meta_key(out, key, binary),
            _ => {}
        }
    }
}

fn meta_get(cache: &Cache, meta: &Meta<'_>, stats: &WorkerStats, out: &mut Vec<u8>) {
    let flags = &meta.flags;
    let key = meta.key.bytes();
    let binary = meta.key.base64;
    let opts = GetOptions {
        touch: flags.ttl().map(|t| cache.exptime_from_protocol(t)),
        vivify: flags.vivify().map(|t| cache.exptime_from_protocol(t)),
        vivify_cas: flags.new_cas(),
        no_bump: flags.has(b'u'),
    };
    let now = cache.clock().now();
    // The closure runs under the shard lock; `ttl_remaining` only reads the clock.
    let write = |hit: &GetHit<'_>| write_mg_hit(cache, hit, flags, binary, now, out);
    let found = match flags.recache() {
        // R<secs>: a hit with less TTL left than this hands out the win token (W).
        Some(r) => cache.get_with_recache(
            &key,
            opts,
            u32::try_from(r.max(0)).unwrap_or(u32::MAX),
            write,
        ),
        None => cache.get_with(&key, opts, write),
    };
    if found.is_some() {
        if flags.ttl().is_some() {
            WorkerStats::add(&stats.cmd_touch, 1);
            WorkerStats::add(&stats.touch_hits, 1);
        } else {
            WorkerStats::add(&stats.cmd_get, 1);
            WorkerStats::add(&stats.get_hits, 1);
        }
        return;
    }
    WorkerStats::add(&stats.cmd_get, 1);
    WorkerStats::add(&stats.get_misses, 1);
    if !flags.quiet() {
        out.extend_from_slice(b"EN");
        echo_opaque_and_key(out, flags, &key, binary);
        out.extend_from_slice(b"\r\n");
    }
}

fn write_mg_hit(
    cache: &Cache,
    hit: &GetHit<'_>,
    flags: &MetaFlags<'_>,
    binary: bool,
    now: u32,
    out: &mut Vec<u8>,
) {
    let it = &hit.item;
    let with_value = flags.has(b'v');
    if with_value {
        out.reserve(it.value.len() + 64);
        reply::write_meta_va(out, it.value.len());
    } else {
        out.extend_from_slice(b"HD");
    }
    for tok in flags.tokens() {
        match tok[0] {
            b's' => write_meta_flag_u64(out, b's', it.value.len() as u64),
            b't' => write_meta_flag_i64(out, b't', cache.ttl_remaining(it.exptime)),
            b'c' => write_meta_flag_u64(out, b'c', it.cas),
            b'f' => write_meta_flag_u64(out, b'f', u64::from(it.flags)),
            b'l' => write_meta_flag_u64(out, b'l', u64::from(now.saturating_sub(it.last_access))),
            b'h' => out.extend_from_slice(if it.fetched { b" h1" } else { b" h0" }),
            b'O' => {
                out.push(b' ');
                out.extend_from_slice(tok);
            }
            b'k' => write_meta_key(out, it.key, binary),
            _ => {}
        }
    }
    // memcached's order: Z (someone else holds the token), X (stale), W (this client won).
    if hit.token_taken_by_other {
        out.extend_from_slice(b" Z");
    }
    if it.stale {
        out.extend_from_slice(b" X");
    }
    if hit.won {
        out.extend_from_slice(b" W");
    }
    out.extend_from_slice(b"\r\n");
    if with_value {
        out.extend_from_slice(it.value);
        out.extend_from_slice(b"\r\n");
    }
}

fn meta_set(cache: &Cache, meta: &Meta<'_>, data: &[u8], stats: &WorkerStats, out: &mut Vec<u8>) {
    let flags = &meta.flags;
    let key = meta.key.bytes();
    let exptime = flags.ttl().map_or(0, |t| cache.exptime_from_protocol(t));
    let client_flags = flags.client_flags().unwrap_or(0);
    let mode = match flags.mode() {
        Some(b'E') => SetMode::Add,
        Some(b'A') => SetMode::Append,
        Some(b'P') => SetMode::Prepend,
        Some(b'R') => SetMode::Replace,
        _ => SetMode::Set,
    };
    let compare = flags.compare_cas();
    // A CAS turns set and replace into cas; add ignores it; append and prepend check it first.
    let (mode, cas_mode) = match (mode, compare) {
        // I with C: an older token still stores, marking the item stale.
        (SetMode::Set | SetMode::Replace, Some(c)) if flags.has(b'I') => {
            (SetMode::CasStale(c), true)
        }
        (SetMode::Set | SetMode::Replace, Some(c)) => (SetMode::Cas(c), true),
        (SetMode::Append | SetMode::Prepend, Some(_)) => (mode, true),
        _ => (mode, false),
    };
    let result = match (mode, compare) {
        (SetMode::Append | SetMode::Prepend, Some(c)) => {
            // The store has no CAS-checked append: check, then append (not atomic).
            match peek(cache, &key, |hit| hit.item.cas) {
                None => Ok(StoreOutcome::NotStored),
                Some(current) if current != c => Ok(StoreOutcome::Exists),
                Some(_) => cache.store(mode, &key, data, client_flags, exptime, flags.new_cas()),
            }
        }
        _ => cache.store(mode, &key, data, client_flags, exptime, flags.new_cas()),
    };
    let outcome = match result {
        Ok(outcome) => outcome,
        Err(e) => {
            // Meta commands report errors even with q.
            out.extend_from_slice(store_failed(e.kind()));
            return;
        }
    };
    WorkerStats::add(&stats.cmd_set, 1);
    if cas_mode {
        count_cas(stats, outcome);
    }
    let (code, cas): (&[u8], u64) = match outcome {
        StoreOutcome::Stored(_) if flags.quiet() => return,
        StoreOutcome::Stored(cas) => (b"HD", cas),
        StoreOutcome::NotStored => (b"NS", 0),
        StoreOutcome::Exists => (b"EX", 0),
        StoreOutcome::NotFound => (b"NF", 0),
    };
    out.extend_from_slice(code);
    for tok in flags.tokens() {
        match tok[0] {
            b'O' => {
                out.push(b' ');
                out.extend_from_slice(tok);
            }
            b'k' => write_meta_key(out, &key, meta.key.base64),
            b'c' => write_meta_flag_u64(out, b'c', cas),
            _ => {}
        }
    }
    out.extend_from_slice(b"\r\n");
}

fn meta_delete(cache: &Cache, meta: &Meta<'_>, stats: &WorkerStats, out: &mut Vec<u8>) {
    let flags = &meta.flags;
    let key = meta.key.bytes();
    let invalidate = flags.has(b'I');
    let code: &[u8] = match cache.delete(&key, flags.compare_cas(), invalidate) {
        DeleteOutcome::Deleted => {
            if invalidate {
                // T only applies to an item kept as stale.
                if let Some(t) = flags.ttl() {
                    cache.touch(&key, cache.exptime_from_protocol(t));
                }
            } else {
                WorkerStats::add(&stats.delete_hits, 1);
            }
            if flags.quiet() {
                return;
            }
            b"HD"
        }
        DeleteOutcome::NotFound => {
            WorkerStats::add(&stats.delete_misses, 1);
            b"NF"
        }
        DeleteOutcome::Exists => {
            WorkerStats::add(&stats.delete_misses, 1);
            b"EX"
        }
    };
    out.extend_from_slice(code);
    echo_opaque_and_key(out, flags, &key, meta.key.base64);
    out.extend_from_slice(b"\r\n");
}

fn meta_arith(cache: &Cache, meta: &Meta<'_>, stats: &WorkerStats, out: &mut Vec<u8>) {
    let flags = &meta.flags;
    let key = meta.key.bytes();
    let incr = !matches!(flags.mode(), Some(b'D' | b'-'));
    let (hits, misses) = if incr {
        (&stats.incr_hits, &stats.incr_misses)
    } else {
        (&stats.decr_hits, &stats.decr_misses)
    };
    let autoviv = flags
        .vivify()
        .map(|n| (flags.initial().unwrap_or(0), cache.exptime_from_protocol(n)));
    let result = cache.arith_with_cas(
        &key,
        incr,
        flags.delta().unwrap_or(1),
        flags.compare_cas(),
        autoviv,
        flags.new_cas(),
    );
    let (value, cas) = match result {
        Ok(ArithOutcome::Value(value, cas)) => (value, cas),
        Ok(ArithOutcome::NotFound) => {
            WorkerStats::add(misses, 1);
            out.extend_from_slice(b"NF");
            echo_opaque_and_key(out, flags, &key, meta.key.base64);
            out.extend_from_slice(b"\r\n");
            return;
        }
        Ok(ArithOutcome::Exists) => {
            out.extend_from_slice(b"EX");
            echo_opaque_and_key(out, flags, &key, meta.key.base64);
            out.extend_from_slice(b"\r\n");
            return;
        }
        Ok(ArithOutcome::NonNumeric) => {
            out.extend_from_slice(reply::NON_NUMERIC);
            return;
        }
        Err(_) => {
            out.extend_from_slice(reply::OUT_OF_MEMORY);
            return;
        }
    };
    WorkerStats::add(hits, 1);
    if let Some(t) = flags.ttl() {
        cache.touch(&key, cache.exptime_from_protocol(t));
    }
    if flags.quiet() {
        return;
    }
    if flags.has(b'v') {
        reply::write_meta_va(out, decimal_len(value));
    } else {
        out.extend_from_slice(b"HD");
    }
    for tok in flags.tokens() {
        match tok[0] {
            b'c' => write_meta_flag_u64(out, b'c', cas),
            b't' => {
                let exptime = peek(cache, &key, |hit| hit.item.exptime).unwrap_or(0);
                write_meta_flag_i64(out, b't', cache.ttl_remaining(exptime));
            }
            b'O' => {
                out.push(b' ');
                out.extend_from_slice(tok);
            }
            b'k' => write_meta_key(out, &key, meta.key.base64),
            _ => {}
        }
    }
    out.extend_from_slice(b"\r\n");
    if flags.has(b'v') {
        push_u64(out, value);
        out.extend_from_slice(b"\r\n");
    }
}

fn decimal_len(mut n: u64) -> usize {
    let mut len = 1;
    while n >= 10 {
        n /= 10;
        len += 1;
    }
    len
}

/// `me`: `ME <key> exp=<-ttl|-1> la=<idle secs> cas=<cas> fetch=<yes|no> cls=1 size=<bytes>`.
/// `exp` is memcached's "now minus expiry" (negative while alive), `size` its item size formula.
fn meta_debug(cache: &Cache, key: &[u8], binary: bool, out: &mut Vec<u8>) {
    let now = cache.clock().now();
    let found = peek(cache, key, |hit| {
        let it = &hit.item;
        out.extend_from_slice(b"ME ");
        reply::write_key(out, it.key, binary);
        out.extend_from_slice(b" exp=");
        let exp = if it.exptime == 0 {
            -1
        } else {
            i64::from(now) - i64::from(it.exptime)
        };
        reply::push_i64(out, exp);
        out.extend_from_slice(b" la=");
        push_u64(out, u64::from(now.saturating_sub(it.last_access)));
        out.extend_from_slice(b" cas=");
        push_u64(out, it.cas);
        out.extend_from_slice(if it.fetched {
            b" fetch=yes"
        } else {
            b" fetch=no"
        });
        out.extend_from_slice(b" cls=1 size=");
        // memcached: 48-byte header, key + NUL, value + CRLF, 8-byte CAS, 4 bytes of non-zero flags.
        let size = 59 + it.key.len() + it.value.len() + if it.flags != 0 { 4 } else { 0 };
        push_u64(out, size as u64);
        out.extend_from_slice(b"\r\n");
    });
    if found.is_none() {
        out.extend_from_slice(b"EN\r\n");
    }
}

#[cfg(test)]
mod tests {
    //! Transcript-style tests: requests go through the real parser, replies are compared byte for
    //! byte with what memcached 1.6.18 answers to the same input (CAS values aside).

    use std::cell::Cell;
    use std::sync::atomic::{AtomicU32, AtomicU64};
    use std::sync::Arc;
    use std::time::Instant;

    use ramgrid_proto::memcache::{parse_request, Limits, ParseError};
    use ramgrid_store::{CacheConfig, ManualClock};

    use super::*;
    use crate::stats::Settings;

    const EPOCH: u64 = 1_700_000_000;

    struct Server {
        shared: Shared,
        clock: Arc<ManualClock>,
    }

    fn server_with(config: CacheConfig, flush_enabled: bool) -> Server {
        let clock = Arc::new(ManualClock::new(EPOCH));
        let shared = Shared {
            cache: Cache::new(config, clock.clone()),
            buffers: crate::buffers::BufferMemory::new(64 << 20),
            settings: Settings {
                threads: 2,
                max_conns: 100,
                limits: Limits::default(),
                flush_enabled,
                token: None,
                auth_timeout: std::time::Duration::from_secs(10),
            },
            started: Instant::now(),
            started_unix: EPOCH,
            curr_connections: AtomicU64::new(1),
            total_connections: AtomicU64::new(3),
            rejected_connections: AtomicU64::new(0),
            verbosity: AtomicU32::new(0),
            workers: vec![
                Arc::new(WorkerStats::default()),
                Arc::new(WorkerStats::default()),
            ],
        };
        Server { shared, clock }
    }

    fn server() -> Server {
        server_with(CacheConfig::default(), true)
    }

    impl Server {
        /// Feeds `input` through parser and dispatcher as a connection would; returns the output
        /// and whether the connection was closed.
        fn run_flow(&self, input: &[u8]) -> (Vec<u8>, Flow) {
            let limits = self.shared.settings.limits;
            let stats = &self.shared.workers[0];
            let mut out = Vec::new();
            let mut pos = 0;
            while pos < input.len() {
                match parse_request(&input[pos..], &limits) {
                    Ok((req, n)) => {
                        pos += n;
                        if execute(&req, &self.shared, stats, &mut out) == Flow::Close {
                            return (out, Flow::Close);
                        }
                    }
                    Err(ParseError::Recoverable { consumed, reply }) => {
                        pos += consumed;
                        out.extend_from_slice(reply.as_bytes());
                    }
                    Err(e) => panic!("{e:?} at {:?}", String::from_utf8_lossy(&input[pos..])),
                }
            }
            (out, Flow::Continue)
        }

        fn run(&self, input: &str) -> String {
            String::from_utf8(self.run_flow(input.as_bytes()).0).unwrap()
        }

        /// The CAS unique of `key` (via gets).
        fn cas(&self, key: &str) -> u64 {
            let out = self.run(&format!("gets {key}\r\n"));
            out.split("\r\n")
                .next()
                .unwrap()
                .rsplit(' ')
                .next()
                .unwrap()
                .parse()
                .unwrap()
        }

        fn stat(&self, name: &str) -> u64 {
            let out = self.run("stats\r\n");
            let line = out
                .lines()
                .find(|l| l.starts_with(&format!("STAT {name} ")))
                .unwrap_or_else(|| panic!("no {name}"));
            line.rsplit(' ').next().unwrap().parse().unwrap()
        }
    }

    #[test]
    fn get_gets_and_misses() {
        let s = server();
        assert_eq!(s.run("get nope\r\n"), "END\r\n");
        assert_eq!(
            s.run("set a 5 0 3\r\nabc\r\nset b 0 0 0\r\n\r\n"),
            "STORED\r\nSTORED\r\n"
        );
        assert_eq!(
            s.run("get a nope b a\r\n"),
            "VALUE a 5 3\r\nabc\r\nVALUE b 0 0\r\n\r\nVALUE a 5 3\r\nabc\r\nEND\r\n"
        );
        let cas = s.cas("a");
        assert_eq!(
            s.run("gets a\r\n"),
            format!("VALUE a 5 3 {cas}\r\nabc\r\nEND\r\n")
        );
        assert_eq!(
            (s.stat("cmd_get"), s.stat("get_hits"), s.stat("get_misses")),
            (7, 5, 2)
        );
    }

    #[test]
    fn gat_touches_and_counts_as_touch() {
        let s = server();
        s.run("set a 1 0 1\r\nx\r\n");
        assert_eq!(s.run("gat 100 a nope\r\n"), "VALUE a 1 1\r\nx\r\nEND\r\n");
        assert_eq!(s.run("mg a t\r\n"), "HD t100\r\n");
        let cas = s.cas("a");
        assert_eq!(
            s.run("gats 0 a\r\n"),
            format!("VALUE a 1 1 {cas}\r\nx\r\nEND\r\n")
        );
        assert_eq!(s.run("mg a t\r\n"), "HD t-1\r\n");
        assert_eq!(
            s.run("gat -1 a\r\nget a\r\n"),
            "VALUE a 1 1\r\nx\r\nEND\r\nEND\r\n"
        );
        assert_eq!(s.run("gat 10\r\n"), "END\r\n");
        assert_eq!(
            (
                s.stat("cmd_touch"),
                s.stat("touch_hits"),
                s.stat("touch_misses")
            ),
            (4, 3, 1)
        );
    }

    #[test]
    fn storage_commands() {
        let s = server();
        assert_eq!(
            s.run("add k 0 0 1\r\na\r\nadd k 0 0 1\r\nb\r\n"),
            "STORED\r\nNOT_STORED\r\n"
        );
        assert_eq!(
            s.run("replace k 3 0 1\r\nc\r\nreplace nope 0 0 1\r\nc\r\n"),
            "STORED\r\nNOT_STORED\r\n"
        );
        assert_eq!(
            s.run("append k 9 9 2\r\nde\r\nprepend k 9 9 2\r\nab\r\n"),
            "STORED\r\nSTORED\r\n"
        );
        assert_eq!(
            s.run("append nope 0 0 1\r\nx\r\nprepend nope 0 0 1\r\nx\r\n"),
            "NOT_STORED\r\nNOT_STORED\r\n"
        );
        // append/prepend keep the item's flags.
        assert_eq!(s.run("get k\r\n"), "VALUE k 3 5\r\nabcde\r\nEND\r\n");
        let cas = s.cas("k");
        assert_eq!(
            s.run(&format!("cas k 0 0 1 {}\r\nx\r\n", cas + 1000)),
            "EXISTS\r\n"
        );
        assert_eq!(s.run(&format!("cas k 7 0 1 {cas}\r\nz\r\n")), "STORED\r\n");
        assert_eq!(s.run("cas nope 0 0 1 1\r\nx\r\n"), "NOT_FOUND\r\n");
        assert_eq!(s.run("get k\r\n"), "VALUE k 7 1\r\nz\r\nEND\r\n");
        assert_eq!(
            s.run("set q 0 0 1 noreply\r\nq\r\nadd q 0 0 1 noreply\r\nq\r\nget q\r\n"),
            "VALUE q 0 1\r\nq\r\nEND\r\n"
        );
        assert_eq!(
            (
                s.stat("cas_hits"),
                s.stat("cas_badval"),
                s.stat("cas_misses")
            ),
            (1, 1, 1)
        );
        assert_eq!(s.stat("cmd_set"), 13);
        // Negative exptime: stored, already gone.
        assert_eq!(
            s.run("set gone 0 -1 1\r\nx\r\nget gone\r\n"),
            "STORED\r\nEND\r\n"
        );
    }

    #[test]
    fn a_value_the_store_refuses_keeps_the_old_one() {
        let config = CacheConfig {
            max_item_size: 200,
            ..CacheConfig::default()
        };
        let s = server_with(config, true);
        let big = "x".repeat(300);
        assert_eq!(s.run("set k 0 0 1\r\na\r\n"), "STORED\r\n");
        let kept = "VALUE k 0 1\r\na\r\nEND\r\n";
        assert_eq!(
            s.run(&format!("set k 0 0 300\r\n{big}\r\nget k\r\n")),
            format!("SERVER_ERROR object too large for cache\r\n{kept}")
        );
        assert_eq!(
            s.run(&format!("append k 0 0 300\r\n{big}\r\nget k\r\n")),
            format!("SERVER_ERROR object too large for cache\r\n{kept}")
        );
        assert_eq!(
            s.run(&format!("set k 0 0 300 noreply\r\n{big}\r\nget k\r\n")),
            kept
        );
        // ms always answers, even with q.
        assert_eq!(
            s.run(&format!("ms k 300 MA q\r\n{big}\r\nmg k v\r\n")),
            "SERVER_ERROR object too large for cache\r\nVA 1\r\na\r\n"
        );
        assert_eq!(s.stat("cmd_set"), 1);
    }

    #[test]
    fn delete_incr_decr_touch() {
        let s = server();
        s.run("set n 0 0 2\r\n10\r\n");
        assert_eq!(
            s.run("incr n 5\r\ndecr n 100\r\nincr n 18446744073709551615\r\nincr n 2\r\n"),
            "15\r\n0\r\n18446744073709551615\r\n1\r\n"
        );
        assert_eq!(
            s.run("incr nope 1\r\ndecr nope 1\r\n"),
            "NOT_FOUND\r\nNOT_FOUND\r\n"
        );
        assert_eq!(
            s.run("set t 0 0 1\r\nx\r\nincr t 1\r\n"),
            "STORED\r\nCLIENT_ERROR cannot increment or decrement non-numeric value\r\n"
        );
        assert_eq!(
            s.run("incr n 1 noreply\r\nincr t 1 noreply\r\nget n\r\n"),
            "VALUE n 0 1\r\n2\r\nEND\r\n"
        );
        assert_eq!(
            (
                s.stat("incr_hits"),
                s.stat("incr_misses"),
                s.stat("decr_hits"),
                s.stat("decr_misses")
            ),
            (4, 1, 1, 1)
        );
        assert_eq!(
            s.run("touch n 10\r\ntouch nope 10\r\ntouch n 10 noreply\r\n"),
            "TOUCHED\r\nNOT_FOUND\r\n"
        );
        assert_eq!(
            (
                s.stat("cmd_touch"),
                s.stat("touch_hits"),
                s.stat("touch_misses")
            ),
            (3, 2, 1)
        );
        s.clock.advance(11);
        assert_eq!(s.stat("get_expired"), 0);
        assert_eq!(s.run("get n\r\n"), "END\r\n");
        assert_eq!(s.stat("get_expired"), 1);
        assert_eq!(
            s.run("delete t\r\ndelete t\r\ndelete nope noreply\r\ndelete t 0\r\n"),
            "DELETED\r\nNOT_FOUND\r\nNOT_FOUND\r\n"
        );
        assert_eq!((s.stat("delete_hits"), s.stat("delete_misses")), (1, 3));
    }

    #[test]
    fn flush_all_now_later_and_disabled() {
        let s = server();
        s.run("set a 0 0 1\r\na\r\n");
        assert_eq!(s.run("flush_all\r\nget a\r\n"), "OK\r\nEND\r\n");
        s.run("set a 0 0 1\r\na\r\n");
        assert_eq!(
            s.run("flush_all 10\r\nget a\r\n"),
            "OK\r\nVALUE a 0 1\r\na\r\nEND\r\n"
        );
        s.clock.advance(10);
        assert_eq!(s.run("get a\r\n"), "END\r\n");
        assert_eq!((s.stat("get_flushed"), s.stat("get_expired")), (2, 0));
        assert_eq!(s.run("flush_all noreply\r\nflush_all -1\r\n"), "OK\r\n");
        assert_eq!(s.stat("cmd_flush"), 4);
        let off = server_with(CacheConfig::default(), false);
        off.run("set a 0 0 1\r\na\r\n");
        assert_eq!(
            off.run("flush_all\r\nflush_all noreply\r\nget a\r\n"),
            "CLIENT_ERROR flush_all not allowed\r\nVALUE a 0 1\r\na\r\nEND\r\n"
        );
    }

    #[test]
    fn version_verbosity_quit_noop() {
        let s = server();
        assert_eq!(s.run("version\r\n"), format!("VERSION {VERSION}\r\n"));
        assert!(VERSION.starts_with(env!("CARGO_PKG_VERSION")));
        assert_eq!(s.run("verbosity 5\r\nverbosity 1 noreply\r\n"), "OK\r\n");
        assert_eq!(s.shared.verbosity.load(Ordering::Relaxed), 1);
        assert_eq!(s.run("mn\r\n"), "MN\r\n");
        let (out, flow) = s.run_flow(b"mn\r\nquit\r\nmn\r\n");
        assert_eq!((out.as_slice(), flow), (&b"MN\r\n"[..], Flow::Close));
    }

    #[test]
    fn stats_lines() {
        let s = server();
        s.run("set a 0 0 1\r\na\r\nget a b\r\n");
        let out = s.run("stats\r\n");
        assert!(out.ends_with("END\r\n"), "{out}");
        let names: Vec<&str> = out
            .lines()
            .filter_map(|l| l.strip_prefix("STAT "))
            .map(|l| l.split(' ').next().unwrap())
            .collect();
        for name in [
            "pid",
            "uptime",
            "time",
            "version",
            "rusage_user",
            "rusage_system",
            "max_connections",
            "curr_connections",
            "total_connections",
            "rejected_connections",
            "cmd_get",
            "cmd_set",
            "cmd_flush",
            "cmd_touch",
            "get_hits",
            "get_misses",
            "get_expired",
            "get_flushed",
            "delete_misses",
            "delete_hits",
            "incr_misses",
            "incr_hits",
            "decr_misses",
            "decr_hits",
            "cas_misses",
            "cas_hits",
            "cas_badval",
            "touch_hits",
            "touch_misses",
            "bytes_read",
            "bytes_written",
            "limit_maxbytes",
            "threads",
            "bytes",
            "curr_items",
            "total_items",
            "evictions",
            "reclaimed",
            "crawler_reclaimed",
        ] {
            assert!(names.contains(&name), "missing {name}");
        }
        assert_eq!(
            names.len(),
            out.lines().count() - 1,
            "only STAT lines before END"
        );
        assert!(out.contains(&format!("STAT version {VERSION}\r\n")));
        assert!(out.contains("STAT threads 2\r\nSTAT bytes "));
        assert!(out.lines().any(|l| l.starts_with("STAT rusage_user ")
            && l.split('.').nth(1).is_some_and(|us| us.len() == 6)));
        assert_eq!(
            (
                s.stat("curr_items"),
                s.stat("total_items"),
                s.stat("total_connections")
            ),
            (1, 1, 3)
        );
        let settings = s.run("stats settings\r\n");
        assert!(
            settings.starts_with("STAT maxbytes 67108864\r\nSTAT maxconns 100\r\n"),
            "{settings}"
        );
        assert!(settings.contains("STAT flush_enabled yes\r\n") && settings.ends_with("END\r\n"));
        assert_eq!(s.run("stats foo\r\nstats reset\r\n"), "ERROR\r\nERROR\r\n");
    }

    #[test]
    fn meta_get_flags_in_request_order() {
        let s = server();
        s.run("set m1 7 0 5\r\nhello\r\n");
        let cas = s.cas("m1");
        s.clock.advance(3);
        // h and l are as they were before this request; gets above fetched it 3 seconds ago.
        assert_eq!(
            s.run("mg m1 s v f t c k O99 h l q\r\n"),
            format!("VA 5 s5 f7 t-1 c{cas} km1 O99 h1 l3\r\nhello\r\n")
        );
        assert_eq!(s.run("mg m1 l\r\n"), "HD l0\r\n");
        assert_eq!(
            s.run("mg m1\r\nmg m1 q\r\nmg m1 k O1 q\r\n"),
            "HD\r\nHD\r\nHD km1 O1\r\n"
        );
        assert_eq!(
            s.run("mg nope v\r\nmg nope v q\r\nmg nope k O5 v s\r\nmn\r\n"),
            "EN\r\nEN knope O5\r\nMN\r\n"
        );
        assert_eq!(s.run("mg m1 T30 t\r\nmg m1 t\r\n"), "HD t30\r\nHD t30\r\n");
        // u: no bump, so the access time stays.
        s.clock.advance(2);
        assert_eq!(
            s.run("mg m1 u l\r\nmg m1 l\r\nmg m1 l\r\n"),
            "HD l2\r\nHD l2\r\nHD l0\r\n"
        );
        assert_eq!((s.stat("cmd_touch"), s.stat("touch_hits")), (1, 1));
    }

    #[test]
    fn meta_get_fresh_item_is_not_yet_hit() {
        let s = server();
        s.run("set f 0 0 1\r\nx\r\n");
        assert_eq!(s.run("mg f h\r\nmg f h\r\n"), "HD h0\r\nHD h1\r\n");
        assert_eq!(s.run("mg f u h\r\n"), "HD h1\r\n");
    }

    #[test]
    fn meta_get_vivify_and_stale_tokens() {
        let s = server();
        let out = s.run("mg viv N30 v c t\r\n");
        assert!(
            out.starts_with("VA 0 c") && out.ends_with(" t30 W\r\n\r\n"),
            "{out}"
        );
        assert_eq!(
            s.run("mg viv N30 v\r\nmg viv\r\n"),
            "VA 0 Z\r\n\r\nHD Z\r\n"
        );
        assert_eq!(
            s.run("ms viv 2\r\nhi\r\nmg viv v\r\n"),
            "HD\r\nVA 2\r\nhi\r\n"
        );
        assert_eq!(
            s.run("md viv I T30\r\nmg viv v t\r\nmg viv v\r\n"),
            "HD\r\nVA 2 t30 X W\r\nhi\r\nVA 2 Z X\r\nhi\r\n"
        );
    }

    #[test]
    fn meta_binary_keys_come_back_in_base64() {
        let s = server();
        assert!(s
            .run("ms YQ== 1 b k c\r\nx\r\n")
            .starts_with("HD kYQ== b c"));
        assert_eq!(
            s.run("mg YQ== b k v\r\nget a\r\n"),
            "VA 1 kYQ== b\r\nx\r\nVALUE a 0 1\r\nx\r\nEND\r\n"
        );
        assert_eq!(
            s.run("mg bm9rZXk= b k O5\r\nmd bm9rZXk= b k\r\n"),
            "EN kbm9rZXk= b O5\r\nNF kbm9rZXk= b\r\n"
        );
        assert_eq!(
            s.run("ma bm9rZXk= b k N0 v\r\n"),
            "VA 1 kbm9rZXk= b\r\n0\r\n"
        );
        assert_eq!(s.run("me YQ== b\r\n").split(' ').nth(1), Some("YQ=="));
        // Non-canonical base64 is decoded and echoed canonically.
        assert_eq!(s.run("mg YR== b k\r\n"), "HD kYQ== b\r\n");
    }

    #[test]
    fn meta_set_modes_and_returns() {
        let s = server();
        let out = s.run("ms k 2 T0 F5 c\r\nhi\r\n");
        let cas: u64 = out
            .trim_end()
            .strip_prefix("HD c")
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(
            s.run("mg k v f c t\r\n"),
            format!("VA 2 f5 c{cas} t-1\r\nhi\r\n")
        );
        assert_eq!(s.run("ms k 1 ME c k O7\r\nx\r\n"), "NS c0 kk O7\r\n");
        assert_eq!(s.run("ms nope 1 MR c\r\nx\r\n"), "NS c0\r\n");
        assert_eq!(
            s.run("ms k 1 MA\r\n!\r\nms k 1 MP\r\n<\r\nmg k v\r\n"),
            "HD\r\nHD\r\nVA 4\r\n<hi!\r\n"
        );
        assert_eq!(s.run("ms nope 1 MA\r\nx\r\n"), "NS\r\n");
        assert_eq!(
            s.run("ms k 1 q\r\nx\r\nms k 1 q ME\r\nx\r\nmn\r\n"),
            "NS\r\nMN\r\n"
        );
        // CAS: set and replace become cas, add ignores it, append checks it first.
        let cas = s.cas("k");
        assert_eq!(
            s.run(&format!(
                "ms k 1 C{}\r\ny\r\nms nope 1 C1 q\r\ny\r\n",
                cas + 1
            )),
            "EX\r\nNF\r\n"
        );
        assert_eq!(s.run(&format!("ms k 1 C{cas} MR\r\ny\r\n")), "HD\r\n");
        let cas = s.cas("k");
        assert_eq!(
            s.run(&format!(
                "ms k 1 MA C{}\r\nz\r\nms k 1 MA C{cas}\r\nz\r\nms nope 1 MA C1\r\nz\r\n",
                cas + 1
            )),
            "EX\r\nHD\r\nNS\r\n"
        );
        assert_eq!(
            s.run("ms k 1 ME C1\r\nx\r\nmg k v\r\n"),
            "NS\r\nVA 2\r\nyz\r\n"
        );
        // E sets the new CAS explicitly.
        assert_eq!(s.run("ms e 1 E12345 c\r\nx\r\n"), "HD c12345\r\n");
        assert_eq!(s.run("mg e c\r\n"), "HD c12345\r\n");
        assert_eq!(
            (
                s.stat("cas_hits"),
                s.stat("cas_badval"),
                s.stat("cas_misses")
            ),
            (2, 2, 1)
        );
        // I without C changes nothing.
        assert_eq!(s.run("ms k 1 I\r\nw\r\nmg k v\r\n"), "HD\r\nVA 1\r\nw\r\n");
        assert_eq!(s.run("ms k 1 T-1\r\nx\r\nmg k\r\n"), "HD\r\nEN\r\n");
    }

    #[test]
    fn meta_delete() {
        let s = server();
        s.run("set d 0 0 1\r\n1\r\n");
        let cas = s.cas("d");
        assert_eq!(
            s.run(&format!("md d C{} q k O1\r\n", cas + 1)),
            "EX kd O1\r\n"
        );
        assert_eq!(
            s.run("md d k O1\r\nmd d q\r\nmd d O2\r\n"),
            "HD kd O1\r\nNF\r\nNF O2\r\n"
        );
        s.run("set d 0 0 1\r\n1\r\n");
        assert_eq!(s.run("md d q\r\nmn\r\n"), "MN\r\n");
        assert_eq!((s.stat("delete_hits"), s.stat("delete_misses")), (2, 3));
    }

    #[test]
    fn meta_arith() {
        let s = server();
        s.run("set n 0 0 1\r\n5\r\n");
        assert_eq!(s.run("ma n\r\nma n q\r\nma n v\r\n"), "HD\r\nVA 1\r\n8\r\n");
        let out = s.run("ma n v MD D10 t k O1 c\r\n");
        assert!(
            out.starts_with("VA 1 t-1 kn O1 c") && out.ends_with("\r\n0\r\n"),
            "{out}"
        );
        assert_eq!(
            s.run("ma n M+ D18446744073709551615 v\r\nma n M- v\r\n"),
            "VA 20\r\n18446744073709551615\r\nVA 20\r\n18446744073709551614\r\n"
        );
        assert_eq!(s.run("ma n MI v\r\n"), "VA 20\r\n18446744073709551615\r\n");
        assert_eq!(
            s.run("ma nope\r\nma nope q O3 k\r\n"),
            "NF\r\nNF O3 knope\r\n"
        );
        assert_eq!(
            s.run("ma newn N0 J7 v\r\nma newn N0 J7 v\r\n"),
            "VA 1\r\n7\r\nVA 1\r\n8\r\n"
        );
        assert_eq!(s.run("ma ttl N100 J1 T50 t v\r\n"), "VA 1 t50\r\n1\r\n");
        let cas = s.cas("n");
        assert_eq!(
            s.run(&format!("ma n C{} k\r\nma n C{cas} v\r\n", cas + 1)),
            "EX kn\r\nVA 1\r\n0\r\n"
        );
        assert_eq!(
            s.run("set t 0 0 1\r\nx\r\nma t q\r\n"),
            "STORED\r\nCLIENT_ERROR cannot increment or decrement non-numeric value\r\n"
        );
        assert_eq!(
            (
                s.stat("incr_hits"),
                s.stat("decr_hits"),
                s.stat("incr_misses")
            ),
            (9, 2, 2)
        );
    }

    #[test]
    fn meta_debug() {
        let s = server();
        assert_eq!(
            s.run("set fl 7 100 5\r\nhello\r\nme nope\r\n"),
            "STORED\r\nEN\r\n"
        );
        let cas = s.cas("fl");
        s.clock.advance(4);
        assert_eq!(
            s.run("me fl\r\n"),
            format!("ME fl exp=-96 la=4 cas={cas} fetch=yes cls=1 size=70\r\n")
        );
        // me does not bump.
        assert_eq!(
            s.run("me fl\r\n"),
            format!("ME fl exp=-96 la=4 cas={cas} fetch=yes cls=1 size=70\r\n")
        );
        s.run("set a 0 0 1\r\nx\r\n");
        assert_eq!(
            s.run("me a\r\n"),
            format!(
                "ME a exp=-1 la=0 cas={} fetch=no cls=1 size=61\r\n",
                cas + 1
            )
        );
    }

    #[test]
    fn protocol_errors_from_the_parser_pass_through() {
        let s = server();
        assert_eq!(s.run("bogus\r\nset k 0 0 abc\r\nabc\r\nset k 0 0 3\r\nabcde\r\n"), "ERROR\r\nCLIENT_ERROR bad command line format\r\nERROR\r\nCLIENT_ERROR bad data chunk\r\nERROR\r\n");
    }

    thread_local! {
        static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
    }

    /// Counts this thread's allocations, so that a test can see what a request costs.
    struct CountingAllocator;

    // SAFETY: forwards to the system allocator unchanged; the counter is a const-initialized
    // thread-local Cell, which never allocates.
    unsafe impl std::alloc::GlobalAlloc for CountingAllocator {
        unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
            ALLOCATIONS.with(|c| c.set(c.get() + 1));
            // SAFETY: same contract as ours.
            unsafe { std::alloc::System.alloc(layout) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
            // SAFETY: same contract as ours.
            unsafe { std::alloc::System.dealloc(ptr, layout) }
        }
    }

    #[global_allocator]
    static ALLOCATOR: CountingAllocator = CountingAllocator;

    #[test]
    fn a_hundred_key_get_allocates_nothing_per_key() {
        let s = server();
        let mut line = String::from("get");
        for i in 0..100 {
            s.run(&format!("set key:{i} 0 0 10\r\n0123456789\r\n"));
            line.push_str(&format!(" key:{i} miss:{i}"));
        }
        line.push_str("\r\n");
        let limits = Limits::default();
        let stats = &s.shared.workers[0];
        let mut out = Vec::with_capacity(1 << 16);
        let mut cost = |input: &[u8]| {
            out.clear();
            let before = ALLOCATIONS.with(Cell::get);
            let (req, _) = parse_request(input, &limits).unwrap();
            execute(&req, &s.shared, stats, &mut out);
            ALLOCATIONS.with(Cell::get) - before
        };
        let one = cost(b"get key:1 miss:1\r\n");
        let hundred = cost(line.as_bytes());
        assert_eq!(out.iter().filter(|&&b| b == b'\n').count(), 201);
        assert_eq!(hundred, one, "allocations: 1 key {one}, 100 keys {hundred}");
        assert_eq!(hundred, 0);
    }
}
