//! The operator pool: the threads that run one operator call's partitions side by side, so that a
//! call over a server's partitions uses its cores (`--threads` of them) and not only the worker
//! thread its connection landed on. The connection's worker waits for the call, as it waited for a
//! single-threaded pass before; other connections' workers go on.
//!
//! One pool per process, sized by the first server started in it (a process holds one server,
//! except in tests); built on first use with one thread per core if no server sized it. A system
//! that refuses the threads gets the calls run on the caller's thread alone, logged.

use std::sync::OnceLock;

use rayon::prelude::*;

static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();

/// Sizes the pool (`threads` threads) unless it is already built; called at server start.
pub fn init(threads: usize) {
    POOL.get_or_init(|| build(threads));
}

fn pool() -> Option<&'static rayon::ThreadPool> {
    POOL.get_or_init(|| build(std::thread::available_parallelism().map_or(1, |n| n.get())))
        .as_ref()
}

fn build(threads: usize) -> Option<rayon::ThreadPool> {
    match rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .thread_name(|i| format!("ramgrid-op-{i}"))
        .build()
    {
        Ok(p) => Some(p),
        Err(e) => {
            tracing::error!("cannot start the operator pool: {e}; operators run on one thread");
            None
        }
    }
}

/// `f` of each item, in order, run side by side on the pool (one item alone runs on the caller).
pub fn map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync + Send) -> Vec<R> {
    match pool() {
        Some(p) if items.len() > 1 && p.current_num_threads() > 1 => {
            p.install(|| items.par_iter().map(&f).collect())
        }
        _ => items.iter().map(f).collect(),
    }
}
