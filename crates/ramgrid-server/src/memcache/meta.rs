//! The meta protocol (`mg`, `ms`, `md`, `ma`, `me`): each command's flags applied to the cache and
//! its reply composed byte for byte as memcached 1.6.18 does (docs/protocol.md, "Meta commands").

use ramgrid_proto::memcache::reply::{
    self, push_u64, write_meta_flag_i64, write_meta_flag_u64, write_meta_key,
};
use ramgrid_proto::memcache::{Meta, MetaFlags};
use ramgrid_store::{
    ArithOutcome, Cache, DeleteOutcome, GetHit, GetOptions, SetMode, StoreOutcome,
};

use super::dispatch::{count_cas, store_failed};
use crate::stats::WorkerStats;

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

pub(super) fn meta_get(cache: &Cache, meta: &Meta<'_>, stats: &WorkerStats, out: &mut Vec<u8>) {
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

pub(super) fn meta_set(
    cache: &Cache,
    meta: &Meta<'_>,
    data: &[u8],
    stats: &WorkerStats,
    out: &mut Vec<u8>,
) {
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

pub(super) fn meta_delete(cache: &Cache, meta: &Meta<'_>, stats: &WorkerStats, out: &mut Vec<u8>) {
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

pub(super) fn meta_arith(cache: &Cache, meta: &Meta<'_>, stats: &WorkerStats, out: &mut Vec<u8>) {
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
pub(super) fn meta_debug(cache: &Cache, key: &[u8], binary: bool, out: &mut Vec<u8>) {
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
