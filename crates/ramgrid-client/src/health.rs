//! Failure detection: each server's observed latency (which sets the hedge delay of reads, see
//! `hedge.rs`), down-marking, and the background probe that alone puts a down server back into
//! rotation.
//!
//! The rules (docs/client.md, rules 2-4, restates them):
//! - **Latency.** Every complete GET reply is a sample of (time from writing the frame to reading
//!   the whole reply, keys in the frame). Samples are normalized to a unit of work
//!   (`1 + keys / 1024`) and smoothed as TCP smooths round trips (RFC 6298: `srtt` gains 1/8 of each
//!   error, `rttvar` 1/4 of each deviation).
//! - **Hedge delay** for a frame of `k` keys: `(srtt + 4 * rttvar) * (1 + k / 1024)`, clamped to
//!   [`HEDGE_MIN`, `HEDGE_MAX`]; [`HEDGE_MAX`] before the first sample. Like TCP's retransmission
//!   timeout, it sits above nearly every normal reply, so a hedge means "later than this server
//!   ever is", and costs a duplicate read, nothing more.
//! - **Slow.** A server that stays silent past its hedge delay while a replica answers its
//!   partitions is marked slow: reads avoid it while any replica of a partition is up. Writes still
//!   go to it (every replica must get them) and wait for it as usual.
//! - **Down.** A server is marked down when a request to it fails (connect, I/O, timeout, garbage,
//!   refusal). Reads avoid it, writes do not wait for it (its keys count as not acknowledged), and
//!   metadata reads leave it out.
//! - **Probe.** A slow or down server comes back only when a probe succeeds (or a request that had
//!   nowhere else to go gets a reply from it), never by the passing of time. A background thread
//!   probes each such server at once, then every [`PROBE_INTERVAL`]: a fresh connection and HELLO,
//!   each bounded by [`PROBE_TIMEOUT`]. A probe refused or broken marks the server down; one that
//!   times out leaves it as it was. A hung server (SIGSTOP, a machine that stopped answering)
//!   therefore costs the prober one probe timeout per interval, and reads nothing.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::client::Inner;
use crate::conn::{Conn, Pool};
use crate::error::Error;

/// Shortest hedge delay: below this a duplicate read costs more than the wait it could save.
pub(crate) const HEDGE_MIN: Duration = Duration::from_millis(2);
/// Longest hedge delay (and the delay before a server's first sample): a hung replica costs a
/// read at most this much more than a live one.
pub(crate) const HEDGE_MAX: Duration = Duration::from_millis(250);
/// Keys that count as one more unit of work in a latency sample (a frame of 0 keys is one unit).
const KEYS_PER_UNIT: f64 = 1024.0;
/// How often a down server is probed.
pub(crate) const PROBE_INTERVAL: Duration = Duration::from_millis(500);
/// Limit for a probe's connect and for its HELLO's answer (each; also at most the request timeout).
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_millis(250);

fn units(keys: usize) -> f64 {
    1.0 + keys as f64 / KEYS_PER_UNIT
}

/// Smoothed latency per unit of work, in seconds (see the module's rules).
#[derive(Debug, Default, Clone)]
pub(crate) struct Latency {
    srtt: f64,
    rttvar: f64,
    samples: u64,
}

impl Latency {
    pub(crate) fn sample(&mut self, elapsed: Duration, keys: usize) {
        let r = elapsed.as_secs_f64() / units(keys);
        if self.samples == 0 {
            self.srtt = r;
            self.rttvar = r / 2.0;
        } else {
            self.rttvar = 0.75 * self.rttvar + 0.25 * (self.srtt - r).abs();
            self.srtt = 0.875 * self.srtt + 0.125 * r;
        }
        self.samples += 1;
    }

    /// How long a reply to a frame of `keys` keys may take before the frame is hedged.
    pub(crate) fn hedge_delay(&self, keys: usize) -> Duration {
        if self.samples == 0 {
            return HEDGE_MAX;
        }
        let secs = (self.srtt + 4.0 * self.rttvar) * units(keys);
        Duration::from_secs_f64(secs.clamp(HEDGE_MIN.as_secs_f64(), HEDGE_MAX.as_secs_f64()))
    }
}

const UP: u8 = 0;
const SLOW: u8 = 1;
const DOWN: u8 = 2;

/// One server's health: up, slow or down, when to probe it next, its latency.
pub(crate) struct Health {
    state: AtomicU8,
    next_probe: Mutex<Instant>,
    latency: Mutex<Latency>,
}

impl Health {
    pub(crate) fn new() -> Health {
        Health {
            state: AtomicU8::new(UP),
            next_probe: Mutex::new(Instant::now()),
            latency: Mutex::new(Latency::default()),
        }
    }

    /// Failed: writes do not wait for it, reads and metadata reads avoid it.
    pub(crate) fn is_down(&self) -> bool {
        self.state.load(Ordering::Relaxed) == DOWN
    }

    /// Slow or down: reads go to another replica if one is up.
    pub(crate) fn avoid_for_reads(&self) -> bool {
        self.state.load(Ordering::Relaxed) != UP
    }

    /// Marks the server down; a server newly out of rotation is probed at once.
    pub(crate) fn mark_down(&self) {
        if self.state.swap(DOWN, Ordering::AcqRel) == UP {
            *self.next_probe.lock() = Instant::now();
        }
    }

    /// Marks an up server slow (a down one stays down); probed at once.
    pub(crate) fn mark_slow(&self) {
        if self
            .state
            .compare_exchange(UP, SLOW, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            *self.next_probe.lock() = Instant::now();
        }
    }

    /// Puts the server back into rotation (a probe or a request succeeded).
    pub(crate) fn mark_up(&self) {
        if self.state.load(Ordering::Relaxed) != UP {
            self.state.store(UP, Ordering::Release);
        }
    }

    pub(crate) fn record(&self, elapsed: Duration, keys: usize) {
        self.latency.lock().sample(elapsed, keys);
    }

    pub(crate) fn hedge_delay(&self, keys: usize) -> Duration {
        self.latency.lock().hedge_delay(keys)
    }
}

/// The background prober of one client: at most one thread, started when a server goes down and
/// ended when none is down (or the client is dropped).
pub(crate) struct Prober {
    state: Mutex<ProberState>,
    wake: Condvar,
}

#[derive(Default)]
struct ProberState {
    /// The process whose thread is running, if one is: after a fork the child has no such thread,
    /// and starts its own.
    running_in: Option<u32>,
    /// Work arrived since the thread last looked (a server went down, or the client is closing).
    kicked: bool,
}

impl Prober {
    pub(crate) fn new() -> Arc<Prober> {
        Arc::new(Prober {
            state: Mutex::new(ProberState::default()),
            wake: Condvar::new(),
        })
    }

    /// A server of `inner` went down: make sure the probe thread runs, and wake it.
    pub(crate) fn kick(&self, inner: &Arc<Inner>) {
        let mut st = self.state.lock();
        st.kicked = true;
        if st.running_in == Some(std::process::id()) {
            self.wake.notify_one();
            return;
        }
        let (weak, prober) = (Arc::downgrade(inner), inner.prober.clone());
        let spawned = std::thread::Builder::new()
            .name("ramgrid-probe".into())
            .spawn(move || run(weak, prober));
        match spawned {
            Ok(_) => st.running_in = Some(std::process::id()),
            // No thread, no probe: rather than leave servers down for good, fall back to trying
            // them again on the next request.
            Err(_) => {
                drop(st);
                for p in inner.pools.lock().values() {
                    p.health.mark_up();
                }
            }
        }
    }

    /// The client is going away: let the thread see it now rather than at its next probe.
    pub(crate) fn stop(&self) {
        self.state.lock().kicked = true;
        self.wake.notify_one();
    }
}

fn run(client: Weak<Inner>, prober: Arc<Prober>) {
    loop {
        let next = {
            let Some(inner) = client.upgrade() else {
                prober.state.lock().running_in = None;
                return;
            };
            let pools: Vec<Arc<Pool>> = inner.pools.lock().values().cloned().collect();
            let mut next: Option<Instant> = None;
            for pool in pools.iter().filter(|p| p.health.avoid_for_reads()) {
                let due = *pool.health.next_probe.lock();
                let at = if due <= Instant::now() {
                    probe(&inner, pool);
                    Instant::now() + PROBE_INTERVAL
                } else {
                    due
                };
                if pool.health.avoid_for_reads() {
                    *pool.health.next_probe.lock() = at;
                    next = Some(next.map_or(at, |n| n.min(at)));
                }
            }
            match next {
                Some(at) => at,
                None => {
                    // Nothing down: end, unless a server went down meanwhile (checked under the lock
                    // `kick` takes, so a kick either sees this thread gone or is seen here).
                    let mut st = prober.state.lock();
                    if !st.kicked
                        && inner
                            .pools
                            .lock()
                            .values()
                            .all(|p| !p.health.avoid_for_reads())
                    {
                        st.running_in = None;
                        return;
                    }
                    st.kicked = false;
                    continue;
                }
            }
        }; // the client is not kept alive while the thread sleeps
        let mut st = prober.state.lock();
        if !st.kicked {
            prober.wake.wait_until(&mut st, next);
        }
        st.kicked = false;
    }
}

/// One probe: a fresh connection and HELLO, each within [`PROBE_TIMEOUT`]. On success the server is
/// up again and the connection joins its pool; refused or broken, it is down; silent, it stays as
/// it was.
fn probe(inner: &Inner, pool: &Pool) {
    let settings = &inner.settings;
    let limit = PROBE_TIMEOUT.min(settings.timeout);
    match Conn::open(
        &pool.addr,
        settings,
        limit.min(settings.connect_timeout),
        limit,
    ) {
        Ok((conn, max_body)) => {
            inner.note_max_body(max_body);
            pool.health.mark_up();
            pool.put_back(conn, settings.pool_size);
        }
        Err(Error::Timeout { .. }) => {}
        Err(_) => pool.health.mark_down(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn hedge_delay_follows_latency_scaled_by_keys_and_clamped() {
        let mut l = Latency::default();
        assert_eq!(l.hedge_delay(10), HEDGE_MAX, "no sample yet");
        // Steady 4 ms for 1024-key frames (2 units): srtt -> 2 ms/unit, rttvar -> 0.
        for _ in 0..200 {
            l.sample(4 * MS, 1024);
        }
        let d = l.hedge_delay(1024);
        assert!(d > 3 * MS && d < 5 * MS, "{d:?}");
        // The same rate predicts more time for more keys.
        let big = l.hedge_delay(10 * 1024);
        assert!(big > 20 * MS && big < 25 * MS, "{big:?}");
        // Clamped at both ends.
        assert_eq!(l.hedge_delay(10_000_000), HEDGE_MAX);
        let mut fast = Latency::default();
        for _ in 0..50 {
            fast.sample(Duration::from_micros(30), 10);
        }
        assert_eq!(fast.hedge_delay(10), HEDGE_MIN);
    }

    #[test]
    fn jitter_widens_the_delay() {
        let mut steady = Latency::default();
        let mut jittery = Latency::default();
        for i in 0..200u32 {
            steady.sample(10 * MS, 0);
            jittery.sample(if i % 2 == 0 { 5 * MS } else { 15 * MS }, 0);
        }
        let (s, j) = (steady.hedge_delay(0), jittery.hedge_delay(0));
        assert!(j > s + 10 * MS, "steady {s:?}, jittery {j:?}");
    }

    #[test]
    fn down_until_marked_up_whatever_the_time() {
        let h = Health::new();
        assert!(!h.is_down() && !h.avoid_for_reads());
        h.mark_slow();
        assert!(
            !h.is_down() && h.avoid_for_reads(),
            "slow: avoided by reads only"
        );
        h.mark_down();
        h.mark_slow();
        assert!(h.is_down(), "slow does not undo down");
        h.mark_up();
        h.mark_down();
        let first = *h.next_probe.lock();
        assert!(
            first <= Instant::now(),
            "a newly down server is probed at once"
        );
        // Marked again while down: the probe schedule stands (no probe storm from many failures).
        *h.next_probe.lock() = first + PROBE_INTERVAL;
        h.mark_down();
        assert_eq!(*h.next_probe.lock(), first + PROBE_INTERVAL);
        assert!(h.is_down());
        h.mark_up();
        assert!(!h.is_down() && !h.avoid_for_reads());
    }
}
