//! Adapts parsed memcached requests to store calls and composes the replies, byte for byte as
//! memcached 1.6.18 does (see `docs/protocol.md` for each command and the few deliberate
//! differences).
//!
//! CONTRACT (fixed): the connection loop calls [`execute_part`] for each parsed request, which
//! appends the reply to `out`, and calls it again after writing `out` out for as long as it answers
//! [`Flow::Partial`] (a multi-key get whose reply passed [`REPLY_HIGH_WATER`]). Replies are written
//! straight into `out`: a multi-key get allocates nothing per key.

use std::sync::atomic::Ordering;

use ramgrid_proto::memcache::reply::{self, push_u64, write_value};
use ramgrid_proto::memcache::{Keys, Request, Store, StoreMode};
use ramgrid_store::{ArithOutcome, Cache, DeleteOutcome, ErrorKind, SetMode, StoreOutcome};

use super::{meta, stats};
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
/// one value in memory, and a client that stops reading stalls it there.
pub const REPLY_HIGH_WATER: usize = 256 << 10;

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
        Request::Stats { arg } => stats::stats_reply(shared, *arg, out),
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
        Request::MetaGet(meta) => meta::meta_get(cache, meta, stats, out),
        Request::MetaSet { meta, data } => meta::meta_set(cache, meta, data, stats, out),
        Request::MetaDelete(meta) => meta::meta_delete(cache, meta, stats, out),
        Request::MetaArith(meta) => meta::meta_arith(cache, meta, stats, out),
        Request::MetaNoop => out.extend_from_slice(reply::MN),
        Request::MetaDebug { key } => meta::meta_debug(cache, &key.bytes(), key.base64, out),
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
/// Returns the keys looked up and the hits among them. The keys go through the store's
/// pipelined lookup in one call, which stops at the high-water mark.
fn get_values(
    cache: &Cache,
    keys: &Keys<'_>,
    touch: Option<u32>,
    with_cas: bool,
    out: &mut Vec<u8>,
    progress: &mut usize,
) -> (u64, u64, Flow) {
    let mut hits = 0u64;
    let asked = cache.get_each(keys.iter().skip(*progress), touch, |item| {
        if let Some(it) = item {
            write_value(out, it.key, it.flags, it.value, with_cas.then_some(it.cas));
            hits += 1;
        }
        out.len() < REPLY_HIGH_WATER
    });
    *progress += asked;
    if *progress < keys.len() {
        return (asked as u64, hits, Flow::Partial);
    }
    out.extend_from_slice(reply::END);
    (asked as u64, hits, Flow::Continue)
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
pub(super) fn store_failed(kind: ErrorKind) -> &'static [u8] {
    match kind {
        ErrorKind::TooLarge => reply::TOO_LARGE,
        _ => reply::OUT_OF_MEMORY_STORING,
    }
}

pub(super) fn count_cas(stats: &WorkerStats, outcome: StoreOutcome) {
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

#[cfg(test)]
mod tests;
