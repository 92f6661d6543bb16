//! Server-wide shared state and per-worker counters.
//!
//! Counters are per worker thread and written only by their owner (relaxed atomics, no contended
//! cache lines on the hot path); `stats` sums them.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use ramgrid_proto::memcache::Limits;
use ramgrid_store::Cache;

/// Counters one worker thread owns.
#[derive(Debug, Default)]
pub struct WorkerStats {
    /// get/gets/gat/gats/mg keys requested.
    pub cmd_get: AtomicU64,
    /// set/add/replace/append/prepend/cas/ms.
    pub cmd_set: AtomicU64,
    /// touch/gat/gats/mg T.
    pub cmd_touch: AtomicU64,
    /// flush_all.
    pub cmd_flush: AtomicU64,
    /// Keys found by a get.
    pub get_hits: AtomicU64,
    /// Keys not found by a get.
    pub get_misses: AtomicU64,
    /// delete hits.
    pub delete_hits: AtomicU64,
    /// delete misses.
    pub delete_misses: AtomicU64,
    /// incr hits.
    pub incr_hits: AtomicU64,
    /// incr misses.
    pub incr_misses: AtomicU64,
    /// decr hits.
    pub decr_hits: AtomicU64,
    /// decr misses.
    pub decr_misses: AtomicU64,
    /// cas that stored.
    pub cas_hits: AtomicU64,
    /// cas on a missing key.
    pub cas_misses: AtomicU64,
    /// cas with a stale token.
    pub cas_badval: AtomicU64,
    /// touch hits.
    pub touch_hits: AtomicU64,
    /// touch misses.
    pub touch_misses: AtomicU64,
    /// Bytes read from clients.
    pub bytes_read: AtomicU64,
    /// Bytes written to clients.
    pub bytes_written: AtomicU64,
    /// Connections closed for TLS: a handshake that failed or did not finish in time (a
    /// plain-text client on a TLS port, a certificate refused), or a TLS client on a plain port.
    pub tls_handshake_failures: AtomicU64,
    /// Native data requests, server-wide (metrics.rs).
    pub native: crate::metrics::NativeCounters,
    /// Native data requests, per table (metrics.rs).
    pub tables: crate::metrics::TableCounters,
}

impl WorkerStats {
    /// Adds `n` to a counter owned by this worker.
    #[inline]
    pub fn add(counter: &AtomicU64, n: u64) {
        // Single writer: a load + store is enough and avoids a locked RMW on the hot path.
        counter.store(
            counter.load(Ordering::Relaxed).wrapping_add(n),
            Ordering::Relaxed,
        );
    }
}

/// Settings the server was started with that `stats settings`-style answers and dispatch need.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Worker threads.
    pub threads: usize,
    /// Connection limit.
    pub max_conns: usize,
    /// Parser limits.
    pub limits: Limits,
    /// Whether `flush_all` is allowed.
    pub flush_enabled: bool,
    /// The auth token both protocols require, if any (see [`crate::auth`]).
    pub token: Option<String>,
    /// How long a connection may stay unauthenticated.
    pub auth_timeout: std::time::Duration,
}

/// Everything the workers share.
pub struct Shared {
    /// The memcached keyspace.
    pub cache: Cache,
    /// The budget of connection buffers, both protocols.
    pub buffers: crate::buffers::BufferMemory,
    /// Start-up settings.
    pub settings: Settings,
    /// When the server started.
    pub started: Instant,
    /// Unix time at start.
    pub started_unix: u64,
    /// Open client connections.
    pub curr_connections: AtomicU64,
    /// Connections ever accepted.
    pub total_connections: AtomicU64,
    /// Connections refused because of `max_conns`.
    pub rejected_connections: AtomicU64,
    /// `verbosity` level (accepted and stored; we log little).
    pub verbosity: AtomicU32,
    /// One entry per worker thread.
    pub workers: Vec<Arc<WorkerStats>>,
}

impl Shared {
    /// Sum of one counter over all workers.
    pub fn sum(&self, pick: impl Fn(&WorkerStats) -> &AtomicU64) -> u64 {
        self.workers
            .iter()
            .map(|w| pick(w).load(Ordering::Relaxed))
            .sum()
    }
}
