//! Time as the store sees it: whole seconds since the clock started, behind a trait so that
//! expiry tests advance time instead of sleeping.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// A source of "server time" in whole seconds. Never goes backwards.
pub trait Clock: Send + Sync + 'static {
    /// Seconds since this clock started (memcached's `rel_time`). Starts at 1 so 0 can mean "never".
    fn now(&self) -> u32;
    /// Unix time in seconds that corresponds to `now() == 0`, used to convert absolute exptimes.
    fn epoch_unix(&self) -> u64;
}

/// The real clock.
#[derive(Debug)]
pub struct SystemClock {
    start: Instant,
    epoch_unix: u64,
}

impl SystemClock {
    /// A clock that starts now.
    pub fn new() -> Self {
        let unix = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        // now() starts at 1, so the epoch is one second before the start.
        SystemClock { start: Instant::now(), epoch_unix: unix.saturating_sub(1) }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> u32 {
        1 + self.start.elapsed().as_secs() as u32
    }
    fn epoch_unix(&self) -> u64 {
        self.epoch_unix
    }
}

/// A clock that only moves when told to (tests).
#[derive(Debug)]
pub struct ManualClock {
    now: AtomicU32,
    epoch_unix: u64,
}

impl ManualClock {
    /// A manual clock at `now() == 1` whose epoch is `epoch_unix`.
    pub fn new(epoch_unix: u64) -> Self {
        ManualClock { now: AtomicU32::new(1), epoch_unix }
    }
    /// Moves time forward by `secs`.
    pub fn advance(&self, secs: u32) {
        self.now.fetch_add(secs, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> u32 {
        self.now.load(Ordering::SeqCst)
    }
    fn epoch_unix(&self) -> u64 {
        self.epoch_unix
    }
}
