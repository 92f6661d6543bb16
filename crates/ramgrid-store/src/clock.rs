//! Time as the store sees it: whole seconds since the clock started, behind a trait so that
//! expiry tests advance time instead of sleeping.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A source of "server time" in whole seconds. Never goes backwards.
pub trait Clock: Send + Sync + 'static {
    /// Seconds since this clock started (memcached's `rel_time`). Starts at 1 so 0 can mean "never".
    fn now(&self) -> u32;
    /// Unix time in seconds that corresponds to `now() == 0`, used to convert absolute exptimes.
    fn epoch_unix(&self) -> u64;
}

/// The real clock. Reading it is one atomic load: a helper thread ("ramgrid-clock") advances the
/// second at each boundary and ends within a second of the clock being dropped. memcached keeps
/// its `current_time` the same way, for the same reason: asking the OS for the time on every
/// lookup costs 20 ns when the vDSO page is cached and well over 100 ns when a random-access
/// workload has pushed it out of the TLB, which is more than the lookup itself. The value lags
/// the true second by the helper's wake-up latency (well under a millisecond on an idle machine).
#[derive(Debug)]
pub struct SystemClock {
    ticks: Arc<Ticks>,
    epoch_unix: u64,
}

#[derive(Debug)]
struct Ticks {
    start: Instant,
    now: AtomicU32,
    /// False if the helper thread could not be started: `now()` then reads the OS clock.
    ticking: AtomicBool,
}

impl Ticks {
    fn read(&self) -> u32 {
        1 + self.start.elapsed().as_secs() as u32
    }
}

impl SystemClock {
    /// A clock that starts now.
    pub fn new() -> Self {
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let ticks = Arc::new(Ticks {
            start: Instant::now(),
            now: AtomicU32::new(1),
            ticking: AtomicBool::new(false),
        });
        let weak = Arc::downgrade(&ticks);
        let spawned = thread::Builder::new()
            .name("ramgrid-clock".into())
            .spawn(move || tick(&weak))
            .is_ok();
        ticks.ticking.store(spawned, Ordering::Relaxed);
        // now() starts at 1, so the epoch is one second before the start.
        SystemClock {
            ticks,
            epoch_unix: unix.saturating_sub(1),
        }
    }
}

/// Advances `now` at each whole second since the start, until the clock is dropped.
fn tick(ticks: &Weak<Ticks>) {
    while let Some(t) = ticks.upgrade() {
        let elapsed = t.start.elapsed();
        t.now
            .fetch_max(1 + elapsed.as_secs() as u32, Ordering::Relaxed);
        drop(t);
        // sleep() never wakes early, so the next read is past the boundary.
        thread::sleep(
            Duration::from_secs(1) - Duration::from_nanos(u64::from(elapsed.subsec_nanos())),
        );
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> u32 {
        if self.ticks.ticking.load(Ordering::Relaxed) {
            self.ticks.now.load(Ordering::Relaxed)
        } else {
            self.ticks.read()
        }
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
        ManualClock {
            now: AtomicU32::new(1),
            epoch_unix,
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_clock_starts_at_one_and_matches_the_os_clock() {
        let clock = SystemClock::new();
        let now = clock.now();
        assert!(now >= 1);
        assert!(
            now <= clock.ticks.read(),
            "the cached second never runs ahead"
        );
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        assert!((clock.epoch_unix() + u64::from(now)).abs_diff(unix) <= 2);
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::new(100);
        assert_eq!((clock.now(), clock.epoch_unix()), (1, 100));
        clock.advance(5);
        assert_eq!(clock.now(), 6);
    }
}
