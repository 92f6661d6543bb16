//! The call deadline: every public call of a [`crate::Client`] ends within
//! [`crate::ClientConfig::call_timeout`], whatever its rounds, failovers, retries and refreshes add up
//! to.
//!
//! The deadline is set by the outermost public call on its thread ([`CallScope`]) and read by every
//! wait underneath it ([`cap`]): a wait for one server is bounded by the request timeout *and* by
//! what is left of the call. Kept per thread rather than passed down because the public calls nest
//! (`get` asks `table_meta`, `set_current` asks `describe_table`): the outer call's deadline must
//! bound the inner ones, and threading an argument through every layer would repeat that rule in
//! each signature. Background work (the health prober) runs outside any call and uses its own limits.

use std::cell::Cell;
use std::time::{Duration, Instant};

use crate::error::Error;

thread_local! {
    /// (deadline, limit) of the call running on this thread, if any.
    static CALL: Cell<Option<(Instant, Duration)>> = const { Cell::new(None) };
}

/// Marks a public call on this thread; the first (outermost) one sets the deadline, and clears it
/// when dropped (on return or unwind).
pub(crate) struct CallScope {
    owner: bool,
}

impl CallScope {
    pub(crate) fn enter(limit: Duration) -> CallScope {
        CALL.with(|c| {
            if c.get().is_some() {
                return CallScope { owner: false };
            }
            // A limit too large to add means no deadline.
            c.set(Instant::now().checked_add(limit).map(|d| (d, limit)));
            CallScope { owner: true }
        })
    }
}

impl Drop for CallScope {
    fn drop(&mut self) {
        if self.owner {
            CALL.with(|c| c.set(None));
        }
    }
}

/// `deadline`, or the call's deadline if that comes first.
pub(crate) fn cap(deadline: Instant) -> Instant {
    match CALL.with(Cell::get) {
        Some((call, _)) => deadline.min(call),
        None => deadline,
    }
}

/// `timeout` from now, capped by the call's deadline.
pub(crate) fn after(timeout: Duration) -> Instant {
    let now = Instant::now();
    cap(now
        .checked_add(timeout)
        .unwrap_or(now + Duration::from_secs(86_400)))
}

/// Whether the call's deadline has passed.
#[cfg(test)]
fn call_expired() -> bool {
    CALL.with(Cell::get)
        .is_some_and(|(d, _)| Instant::now() >= d)
}

/// The error for a wait on `server` that ran out of time: [`Error::CallTimeout`] if the call's
/// deadline is what ran out, else [`Error::Timeout`] (the request timeout).
pub(crate) fn timeout_error(server: &str) -> Error {
    match CALL.with(Cell::get) {
        Some((d, limit)) if Instant::now() >= d => Error::CallTimeout {
            server: server.to_string(),
            limit,
        },
        _ => Error::Timeout {
            server: server.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_outermost_call_sets_the_deadline_and_clears_it() {
        let far = Instant::now() + Duration::from_secs(3600);
        assert_eq!(cap(far), far);
        {
            let _outer = CallScope::enter(Duration::from_millis(10));
            let d = cap(far);
            assert!(d < far);
            {
                // A nested call does not extend it.
                let _inner = CallScope::enter(Duration::from_secs(60));
                assert_eq!(cap(far), d);
            }
            assert_eq!(cap(far), d, "the inner scope left the outer deadline alone");
            assert!(matches!(timeout_error("s"), Error::Timeout { .. }));
            let mut spins = 0u64;
            while !call_expired() {
                spins += 1;
                std::hint::spin_loop();
                assert!(spins < 10_000_000_000, "the deadline never passed");
            }
            assert!(matches!(timeout_error("s"), Error::CallTimeout { .. }));
        }
        assert_eq!(cap(far), far);
        assert!(!call_expired());
        // No deadline at all for a limit that cannot be added.
        let _huge = CallScope::enter(Duration::MAX);
        assert_eq!(cap(far), far);
    }
}
