//! `stats` and its sub-commands (`stats settings`), as memcached 1.6.18 prints them: the general
//! counters summed over the workers, the process's CPU time, and the settings.

use std::sync::atomic::Ordering;
use std::time::{SystemTime, UNIX_EPOCH};

use ramgrid_proto::memcache::reply::{self, push_u64};

use super::dispatch::VERSION;
use crate::stats::{Shared, WorkerStats};

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

pub(super) fn stats_reply(shared: &Shared, arg: Option<&[u8]>, out: &mut Vec<u8>) {
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
